// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the wire protocol of the compiled a2e/e2a, shared
// by the AscendC kernels (bisheng) and the host binding (g++). Plain C++17, no CANN or torch.
//
// The message header is afd_ascend_ops/header.py's OpsHeader: 64 bytes, little endian, its
// FIELDS zero-padded. Its constants (size, magic, version, op and dtype codes, flag bits, each
// field's offset and size) are generated from that table into afd_header_table.h (python -m
// afd_ascend_ops.header_c --write); never write them here. Every field is naturally aligned,
// so the header is handled as 16 little-endian u32 words, a field of at most 4 bytes within
// one word, seq (8 bytes) in two, low word first. The compiled kernels send and accept a2e
// and e2a only; dispatch and combine are the CAM async reference ops' codes.
#pragma once

#include "afd_header_table.h"
#include "afd_portable.h"

namespace afd {

// ---- header --------------------------------------------------------------------------------

constexpr uint32_t kHeaderWords = kHeaderBytes / 4;
static_assert(kBytesMagic == 4 && kOffsetMagic % 4 == 0, "the magic is one u32 word");
static_assert(kBytesSeq == 8 && kOffsetSeq % 8 == 0, "seq is two u32 words");

// One header, decoded. Field order and meaning as OpsHeader's.
struct Header {
    uint32_t magic;
    uint32_t version;
    uint32_t op;
    uint32_t dtype;
    uint64_t seq;  // the sender's call number on this group with this peer
    uint32_t source;
    uint32_t destination;
    uint32_t rows;
    uint32_t hidden;
    uint32_t topk;
    uint32_t flags;
    uint32_t layer;
};

// A header of this version with the given fields (what a sender writes, what a receiver expects).
AFD_FN Header MakeHeader(uint32_t op, uint32_t dtype, uint64_t seq, uint32_t source,
                         uint32_t destination, uint32_t rows, uint32_t hidden, uint32_t topk,
                         bool gated)
{
    Header h{};
    h.magic = kHeaderMagic;
    h.version = kHeaderVersion;
    h.op = op;
    h.dtype = dtype;
    h.seq = seq;
    h.source = source;
    h.destination = destination;
    h.rows = rows;
    h.hidden = hidden;
    h.topk = gated ? topk : 0;
    h.flags = gated ? kFlagGated : 0;
    h.layer = 0;
    return h;
}

// The field of `bytes` (at most 4) bytes at byte `offset` of the header's words.
AFD_FN uint32_t GetField(const uint32_t words[kHeaderWords], uint32_t offset, uint32_t bytes)
{
    const uint32_t value = words[offset / 4] >> (8 * (offset % 4));
    return bytes == 4 ? value : value & ((1u << (8 * bytes)) - 1u);
}

AFD_FN void PutField(uint32_t words[kHeaderWords], uint32_t offset, uint32_t bytes,
                     uint32_t value)
{
    const uint32_t mask = bytes == 4 ? 0xFFFFFFFFu : (1u << (8 * bytes)) - 1u;
    words[offset / 4] |= (value & mask) << (8 * (offset % 4));
}

AFD_FN void EncodeHeader(const Header& h, uint32_t words[kHeaderWords])
{
    for (uint32_t i = 0; i < kHeaderWords; ++i) {
        words[i] = 0;
    }
    PutField(words, kOffsetMagic, kBytesMagic, h.magic);
    PutField(words, kOffsetVersion, kBytesVersion, h.version);
    PutField(words, kOffsetOp, kBytesOp, h.op);
    PutField(words, kOffsetDtype, kBytesDtype, h.dtype);
    PutField(words, kOffsetSeq, 4, static_cast<uint32_t>(h.seq));
    PutField(words, kOffsetSeq + 4, 4, static_cast<uint32_t>(h.seq >> 32));
    PutField(words, kOffsetSource, kBytesSource, h.source);
    PutField(words, kOffsetDestination, kBytesDestination, h.destination);
    PutField(words, kOffsetRows, kBytesRows, h.rows);
    PutField(words, kOffsetHiddenSize, kBytesHiddenSize, h.hidden);
    PutField(words, kOffsetTopk, kBytesTopk, h.topk);
    PutField(words, kOffsetFlags, kBytesFlags, h.flags);
    PutField(words, kOffsetLayer, kBytesLayer, h.layer);
}

AFD_FN Header DecodeHeader(const uint32_t words[kHeaderWords])
{
    Header h{};
    h.magic = GetField(words, kOffsetMagic, kBytesMagic);
    h.version = GetField(words, kOffsetVersion, kBytesVersion);
    h.op = GetField(words, kOffsetOp, kBytesOp);
    h.dtype = GetField(words, kOffsetDtype, kBytesDtype);
    h.seq = static_cast<uint64_t>(GetField(words, kOffsetSeq, 4)) |
            (static_cast<uint64_t>(GetField(words, kOffsetSeq + 4, 4)) << 32);
    h.source = GetField(words, kOffsetSource, kBytesSource);
    h.destination = GetField(words, kOffsetDestination, kBytesDestination);
    h.rows = GetField(words, kOffsetRows, kBytesRows);
    h.hidden = GetField(words, kOffsetHiddenSize, kBytesHiddenSize);
    h.topk = GetField(words, kOffsetTopk, kBytesTopk);
    h.flags = GetField(words, kOffsetFlags, kBytesFlags);
    h.layer = GetField(words, kOffsetLayer, kBytesLayer);
    return h;
}

// Fields a receiver compares (OpsHeader.differences), as bits of a mask.
enum HeaderField : uint32_t {
    kFieldOp = 1u << 0,
    kFieldSeq = 1u << 1,
    kFieldSource = 1u << 2,
    kFieldDestination = 1u << 3,
    kFieldRows = 1u << 4,
    kFieldHidden = 1u << 5,
    kFieldDtype = 1u << 6,
    kFieldTopk = 1u << 7,
    kFieldGated = 1u << 8,
    kFieldLayer = 1u << 9,
};

// Whether `got` is a header of this protocol version at all (OpsHeader.decode's checks:
// magic, version, known op and dtype codes, no unknown flag bits).
AFD_FN bool IsWellFormed(const Header& got)
{
    return got.magic == kHeaderMagic && got.version == kHeaderVersion && got.op >= 1 &&
           got.op <= kOpLast && got.dtype >= 1 && got.dtype <= kDtypeLast &&
           (got.flags & ~kFlagsKnown) == 0;
}

// The mask of fields in which `got` differs from `expected`; `anyRows` leaves rows unchecked
// (an FFN rank that was not told how many rows a block member sends).
AFD_FN uint32_t HeaderDifferences(const Header& got, const Header& expected, bool anyRows)
{
    uint32_t mask = 0;
    mask |= got.op != expected.op ? kFieldOp : 0u;
    mask |= got.seq != expected.seq ? kFieldSeq : 0u;
    mask |= got.source != expected.source ? kFieldSource : 0u;
    mask |= got.destination != expected.destination ? kFieldDestination : 0u;
    mask |= (!anyRows && got.rows != expected.rows) ? kFieldRows : 0u;
    mask |= got.hidden != expected.hidden ? kFieldHidden : 0u;
    mask |= got.dtype != expected.dtype ? kFieldDtype : 0u;
    mask |= got.topk != expected.topk ? kFieldTopk : 0u;
    mask |= (got.flags & kFlagGated) != (expected.flags & kFlagGated) ? kFieldGated : 0u;
    mask |= got.layer != expected.layer ? kFieldLayer : 0u;
    return mask;
}

// ---- status word ---------------------------------------------------------------------------
// The kernel cannot raise: it writes what went wrong into an int64 status tensor of
// kStatusWords words that the host binding reads after the call and turns into an error.
//
//   [0] code   [1] peer world rank (or -1)   [2] a   [3] b   [4] c   [5..7] zero
//   [8..15]  the received header's 16 u32 words, two per int64 (low word first)
//   [16..23] the expected header, likewise
// The meaning of a, b, c per code is given below.

constexpr uint32_t kStatusWords = 24;
constexpr uint32_t kStatusReceivedHeader = 8;
constexpr uint32_t kStatusExpectedHeader = 16;

enum StatusCode : int64_t {
    kStatusOk = 0,
    // A received header is malformed or differs from the expected one. a: 1 when rows were
    // not checked (no expected count). Both headers are in the status.
    kStatusHeaderMismatch = 1,
    // FFN a2e: the block's counts do not sum to batch_size. a: their sum, b: batch_size. The
    // per-source counts are in the atten_batch_size output.
    kStatusCountSum = 2,
    // A wait reached the call's spin limit. a: what was waited for (WaitKind), b: the seq of
    // the message concerned, c: its op code.
    kStatusTimeout = 3,
    // The host set the stop word during a wait. a, b, c as for kStatusTimeout.
    kStatusStopped = 4,
    // FFN a2e: expert_ids (expected rows per block member) has an entry below -1.
    // a: the index, b: the value.
    kStatusBadExpected = 5,
    // FFN e2a: atten_batch_size is not what a2e returned (an entry below -1, or a non-zero
    // entry past the block). a: the index, b: the value, c: the block size.
    kStatusBadCounts = 6,
    // FFN e2a: the counts of atten_batch_size do not sum to the rows of expand_x and to
    // batch_size. a: the sum, b: expand_x's rows, c: batch_size.
    kStatusCountRows = 7,
    // A message does not fit its mailbox slot. a: the message's bytes, b: the slot's bytes,
    // c: 1 when the sender found it, 2 when a receiver did (a header announcing too many rows).
    kStatusTooLarge = 8,
    // The HCCL window the communicator has (HcclOpResParam::winSize, read on the device) is
    // smaller than the one the tiling laid the mailbox out in (HCCL_BUFFSIZE on the host):
    // writes would go past it. a: the tiling's window bytes, b: the device's.
    kStatusWindowSize = 9,
};

enum WaitKind : int64_t {
    kWaitArrival = 1,  // the peer's message
    kWaitRelease = 2,  // the peer taking this rank's previous message out of its slot
};

}  // namespace afd
