// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the error message for a kernel's status words
// (common/afd_protocol.h), in the reference kernels' words (afd_ascend_ops/reference/group.py,
// afd_ascend_ops/header.py, afd_core/kit/channel.py): who sent what, what this rank expected,
// what to do.
//
// Every message starts with the afd_core error class the reference raises in that case
// ("[AFDProtocolError] ", "[AFDPeerError] ", "[AFDShutdown] ", "[ValueError] "), so the Python
// side can re-raise it as that class; the binding itself raises through TORCH_CHECK.
// Host C++17 only.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "afd_mailbox.h"
#include "afd_protocol.h"

namespace afd {
namespace binding {

// What the reference says after a mismatched header (reference/group.py's MISPAIRED).
constexpr const char* kMispaired =
    "The two roles' calls are mispaired (a call skipped or repeated, other rows than the FFN "
    "rank expects, or different hidden_size, dtype or routing arguments): call a2e and e2a "
    "once per layer and stage on both roles, with the same model and row counts";

// The call a status belongs to.
struct CallSite {
    const char* op;            // "a2e" / "e2a"
    std::string group;         // group_ep
    World world;
    double timeoutS;
};

// "FFN rank 0 (world rank 0)" / "attention rank 1 (world rank 3)" (afd_core.wire.describe_rank).
inline std::string DescribeRank(const World& world, int64_t worldRank)
{
    std::ostringstream out;
    if (worldRank < static_cast<int64_t>(world.ffnRanks)) {
        out << "FFN rank " << worldRank;
    } else {
        out << "attention rank " << worldRank - world.ffnRanks;
    }
    out << " (world rank " << worldRank << ")";
    return out.str();
}

inline std::string OpName(uint32_t code)
{
    return code >= 1 && code <= kOpLast ? kOpNames[code - 1] : "op code " + std::to_string(code);
}

inline std::string DtypeName(uint32_t code)
{
    return code >= 1 && code <= kDtypeLast ? kDtypeNames[code - 1]
                                           : "dtype code " + std::to_string(code);
}

// The header packed into status words [at, at + 8) (two u32 words per int64, low first).
inline Header UnpackHeader(const int64_t* words, uint32_t at)
{
    uint32_t raw[kHeaderWords];
    for (uint32_t i = 0; i < kHeaderWords / 2; ++i) {
        uint64_t pair = static_cast<uint64_t>(words[at + i]);
        raw[2 * i] = static_cast<uint32_t>(pair);
        raw[2 * i + 1] = static_cast<uint32_t>(pair >> 32);
    }
    return DecodeHeader(raw);
}

// "field: sent X, expected Y" for every differing field (OpsHeader.differences, values
// as Python's repr writes them).
inline std::string Differences(const Header& got, const Header& expected, bool anyRows)
{
    uint32_t mask = HeaderDifferences(got, expected, anyRows);
    std::vector<std::string> parts;
    auto add = [&](uint32_t field, const char* name, const std::string& sent,
                   const std::string& want) {
        if (mask & field) {
            parts.push_back(std::string(name) + ": sent " + sent + ", expected " + want);
        }
    };
    auto quoted = [](const std::string& s) { return "'" + s + "'"; };
    auto flag = [](uint32_t flags) { return std::string(flags & kFlagGated ? "True" : "False"); };
    add(kFieldOp, "op", quoted(OpName(got.op)), quoted(OpName(expected.op)));
    add(kFieldSeq, "seq", std::to_string(got.seq), std::to_string(expected.seq));
    add(kFieldSource, "source", std::to_string(got.source), std::to_string(expected.source));
    add(kFieldDestination, "destination", std::to_string(got.destination),
        std::to_string(expected.destination));
    add(kFieldRows, "rows", std::to_string(got.rows), std::to_string(expected.rows));
    add(kFieldHidden, "hidden_size", std::to_string(got.hidden), std::to_string(expected.hidden));
    add(kFieldDtype, "dtype", quoted(DtypeName(got.dtype)), quoted(DtypeName(expected.dtype)));
    add(kFieldTopk, "topk", std::to_string(got.topk), std::to_string(expected.topk));
    add(kFieldGated, "gated", flag(got.flags), flag(expected.flags));
    add(kFieldLayer, "layer", std::to_string(got.layer), std::to_string(expected.layer));
    std::string joined;
    for (const std::string& part : parts) {
        joined += (joined.empty() ? "" : "; ") + part;
    }
    return joined;
}

// Why a received header is not one of this protocol version (OpsHeader.decode's errors).
inline std::string Malformed(const Header& got)
{
    std::ostringstream out;
    if (got.magic != kHeaderMagic) {
        out << "a message starts with 0x" << std::hex << got.magic << std::dec
            << ", not the header magic b'AFDA'; the peer is out of step or does not run these ops";
    } else if (got.version != kHeaderVersion) {
        out << "header version " << got.version << ", this side speaks " << kHeaderVersion
            << "; install the same afd-ascend-ops version on both roles";
    } else {
        out << "unknown op code " << got.op << ", dtype code " << got.dtype << " or flags 0x"
            << std::hex << got.flags << std::dec
            << " in a header; install the same afd-ascend-ops version on both roles";
    }
    return out.str();
}

// What a timed-out or stopped wait was for.
inline std::string WaitedFor(const CallSite& site, const int64_t* w)
{
    std::string peer = DescribeRank(site.world, w[1]);
    std::string call = OpName(static_cast<uint32_t>(w[4])) + " call " + std::to_string(w[3]) +
                       " on group '" + site.group + "'";
    return w[2] == kWaitRelease ? peer + " to take " + call + " out of its mailbox"
                                : call + " from " + peer;
}

// The error message for status words `w` (code != kStatusOk). `counts`: the a2e's
// atten_batch_size output as written by the kernel (used for kStatusCountSum).
inline std::string StatusMessage(const CallSite& site, const int64_t* w,
                                 const std::vector<int64_t>& counts)
{
    const World& world = site.world;
    std::string me = DescribeRank(world, world.rank);
    std::string where = std::string("afd_ascend::") + site.op + " on group '" + site.group + "': ";
    std::ostringstream out;
    switch (w[0]) {
        case kStatusHeaderMismatch: {
            Header got = UnpackHeader(w, kStatusReceivedHeader);
            Header expected = UnpackHeader(w, kStatusExpectedHeader);
            std::string peer = DescribeRank(world, w[1]);
            if (!IsWellFormed(got)) {
                out << "[AFDProtocolError] afd_ascend: " << Malformed(got) << " [sent by " << peer
                    << " to " << me << "]";
            } else {
                out << "[AFDProtocolError] " << where << "the message " << peer
                    << " sent differs from what " << me
                    << " expects: " << Differences(got, expected, w[2] != 0) << ". " << kMispaired;
            }
            break;
        }
        case kStatusCountSum: {
            out << "[AFDProtocolError] " << where << "the attention ranks of " << me
                << "'s block sent " << w[2] << " rows (";
            bool first = true;
            for (uint32_t i = 0; i < world.PeerCount() && i < counts.size(); ++i) {
                if (counts[i] != -1) {
                    out << (first ? "" : ", ") << DescribeRank(world, world.PeerWorldRank(i))
                        << ": " << counts[i];
                    first = false;
                }
            }
            out << "), but its a2e expects batch_size=" << w[3]
                << "; pass the sum of the block's token counts of this layer and stage";
            break;
        }
        case kStatusTimeout:
            out << "[AFDPeerError] AFD: " << DescribeRank(world, w[1]) << " did not answer within "
                << site.timeoutS << " s (" << me << " waited for " << WaitedFor(site, w)
                << "); it is stuck or overloaded, or the roles disagree on the step sequence "
                   "(afd_process_group_timeout_s sets this limit)";
            break;
        case kStatusStopped:
            out << "[AFDShutdown] " << where << "the op provider was interrupted or closed while "
                << me << " waited for " << WaitedFor(site, w);
            break;
        case kStatusBadExpected:
            out << "[ValueError] " << where << "on an FFN rank, expert_ids gives the rows expected "
                << "from each of its " << world.PeerCount() << " block members (-1: takes no "
                << "part), but entry " << w[2] << " is " << w[3];
            break;
        case kStatusBadCounts:
            out << "[AFDProtocolError] " << where << "atten_batch_size[" << w[2] << "] is " << w[3]
                << ", not what a2e returned on " << me << " (" << world.Slots()
                << " counts, the first " << w[4]
                << " for its block (-1: took no part), the rest 0); pass output [3] of the "
                   "matching a2e";
            break;
        case kStatusCountRows:
            out << "[AFDProtocolError] " << where << "expand_x has " << w[3]
                << " rows, batch_size=" << w[4] << " and atten_batch_size sums to " << w[2]
                << "; they must agree (the rows a2e returned, one result row each)";
            break;
        case kStatusTooLarge:
            if (w[4] == 1) {
                out << "[ValueError] " << where << "a message of " << w[2] << " bytes to "
                    << DescribeRank(world, w[1]) << " does not fit its mailbox slot of " << w[3]
                    << " bytes; raise HCCL_BUFFSIZE (equal on every rank) or send fewer rows";
            } else {
                out << "[AFDProtocolError] " << where << DescribeRank(world, w[1])
                    << " announced a message of " << w[2] << " bytes, larger than its mailbox "
                    << "slot of " << w[3] << " bytes; " << kMispaired;
            }
            break;
        case kStatusWindowSize:
            out << "[AFDError] " << where << "the mailbox was laid out in an HCCL window of "
                << w[2] << " bytes (HCCL_BUFFSIZE where the op was tiled), but the communicator's "
                << "window on " << me << " has " << w[3] << " bytes; set HCCL_BUFFSIZE to the "
                << "same value in the environment of every rank before it starts";
            break;
        default:
            out << "[AFDError] " << where << "unknown status code " << w[0]
                << "; the kernels and the binding come from different builds of afd-ascend-ops";
    }
    return out.str();
}

}  // namespace binding
}  // namespace afd
