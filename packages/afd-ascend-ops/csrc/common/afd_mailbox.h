// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): who talks to whom, and where the messages lie.
// Shared by the AscendC kernels, their tiling and the host binding. Plain C++17, no CANN.
//
// World. World ranks are FFN first: rank < F is FFN rank `rank`, the others attention rank
// `rank - F`. FFN rank k serves the contiguous block of BlockSize(k) attention ranks from
// BlockStart(k): the first A % F blocks have A / F + 1 ranks, the others A / F
// (afd_core.topology.Topology.block_of).
//
// Peers. A rank talks to Slots() = ceil(A / F) peer indices at most: an FFN rank to its block
// members (peer index i = attention rank BlockStart(k) + i), an attention rank to its FFN rank
// only (peer index 0).
//
// Mailbox. Each rank's HCCL window (the "windows in" memory its peers write into) is laid out
// alike on every rank, from the same A, F and window size (HCCL_BUFFSIZE, equal on every rank):
//
//   slots:   from offset 0, slot i, SlotBytes() bytes: the message from peer i:
//     header (64 bytes) | rows | expert ids (int32 [rows, topk]) | scales (float32 [rows, topk])
//     each section starting on a kAlign boundary; ids and scales only when gated.
//   control: right after the last slot, at the window's end (ControlOffset()): for each peer
//            index i, two u32 words, each alone in a kCtrlStride-byte line:
//     arrived[i]   written by peer i: (seq + 1) of the last message it completed in slot i
//     released[i]  written by peer i: (seq + 1) of the last message of this rank it took out
//                  of its own slot (so this rank may write the next one)
//
// The control words sit at the window's end, away from its start, where HCCL stages the data of
// its own collectives on the communicator; and no HCCL collective runs on the group after the
// reset (the NPU op provider's barrier after it goes through the rendezvous store, not HCCL).
// 0 in a control word means "nothing yet": the group's reset (a2e in reset mode, run once per
// rank when the group opens, then that barrier) zeroes the control words of this rank's window.
// Only low 32 bits of seq travel in a control word; the header carries all 64 and is checked.
//
// State. The binding owns one int64 tensor per group and rank, zeroed when the group opens;
// the kernels keep in it, per peer index i: calls[i] (the next seq with that peer: every call
// between the two counts, sends and receives alike, as the reference's next_call), sent[i]
// ((seq + 1) of this rank's last message to i, 0: none) and taken[i] ((seq + 1) of the last
// message from i this rank took out of its slot, 0: none).
#pragma once

#include "afd_portable.h"

namespace afd {

constexpr uint64_t kAlign = 512;       // section alignment inside a window
constexpr uint64_t kCtrlStride = 64;   // one control word per data-cache line
constexpr uint32_t kMaxPeers = 64;     // the largest block one FFN rank may serve
constexpr uint32_t kStateFields = 3;   // calls, sent, taken

AFD_FN uint64_t AlignUp(uint64_t value, uint64_t align)
{
    return (value + align - 1) / align * align;
}

// ---- world ---------------------------------------------------------------------------------

struct World {
    uint32_t ffnRanks;        // F
    uint32_t attentionRanks;  // A (>= F)
    uint32_t rank;            // this rank's world rank

    AFD_FN bool IsFfn() const { return rank < ffnRanks; }
    // ceil(A / F): the length of atten_batch_size, the peer indices of every rank.
    AFD_FN uint32_t Slots() const { return (attentionRanks + ffnRanks - 1) / ffnRanks; }
    // First attention rank of FFN rank k's block, and the block's size.
    AFD_FN uint32_t BlockStart(uint32_t k) const
    {
        uint32_t base = attentionRanks / ffnRanks;
        uint32_t extra = attentionRanks % ffnRanks;
        return k * base + (k < extra ? k : extra);
    }
    AFD_FN uint32_t BlockSize(uint32_t k) const
    {
        return attentionRanks / ffnRanks + (k < attentionRanks % ffnRanks ? 1u : 0u);
    }
    // The FFN rank serving attention rank a (Topology.ffn_rank_of).
    AFD_FN uint32_t FfnRankOf(uint32_t a) const
    {
        uint32_t base = attentionRanks / ffnRanks;
        uint32_t extra = attentionRanks % ffnRanks;
        uint32_t big = extra * (base + 1);
        return a < big ? a / (base + 1) : extra + (a - big) / base;
    }
    // This rank's peers: how many, and the world rank of peer index i.
    AFD_FN uint32_t PeerCount() const { return IsFfn() ? BlockSize(rank) : 1u; }
    AFD_FN uint32_t PeerWorldRank(uint32_t i) const
    {
        return IsFfn() ? ffnRanks + BlockStart(rank) + i : FfnRankOf(rank - ffnRanks);
    }
    // The peer index this rank has in peer i's own numbering (the slot it writes there).
    AFD_FN uint32_t IndexAtPeer() const
    {
        if (IsFfn()) {
            return 0;  // an attention rank's only peer
        }
        uint32_t a = rank - ffnRanks;
        return a - BlockStart(FfnRankOf(a));
    }
};

// ---- window --------------------------------------------------------------------------------

struct Window {
    uint64_t windowBytes;  // the HCCL window size, equal on every rank (HCCL_BUFFSIZE)
    uint32_t slots;        // World::Slots()

    AFD_FN uint64_t ControlBytes() const { return AlignUp(2ull * slots * kCtrlStride, kAlign); }
    // 0 when the window cannot hold the control words and one slot per peer.
    AFD_FN uint64_t SlotBytes() const
    {
        uint64_t control = ControlBytes();
        return windowBytes <= control ? 0 : (windowBytes - control) / slots / kAlign * kAlign;
    }
    AFD_FN uint64_t SlotOffset(uint32_t i) const { return i * SlotBytes(); }
    // The control words start right after the last slot (the window's last ControlBytes() when
    // the window size is a multiple of kAlign, as HCCL_BUFFSIZE's MiB are).
    AFD_FN uint64_t ControlOffset() const { return slots * SlotBytes(); }
    AFD_FN uint64_t ArrivedOffset(uint32_t i) const { return ControlOffset() + i * kCtrlStride; }
    AFD_FN uint64_t ReleasedOffset(uint32_t i) const
    {
        return ControlOffset() + (slots + i) * kCtrlStride;
    }
};

// Where the sections of one message lie inside its slot, and how large the whole is.
struct MessageLayout {
    uint64_t rowsOffset;
    uint64_t idsOffset;
    uint64_t scalesOffset;
    uint64_t totalBytes;
};

AFD_FN MessageLayout LayoutMessage(uint64_t rows, uint64_t rowBytes, uint64_t topk, bool gated)
{
    MessageLayout m{};
    uint64_t routingBytes = gated ? rows * topk * 4 : 0;  // int32 ids, then float32 scales
    m.rowsOffset = kAlign;                               // the header's line, padded
    m.idsOffset = m.rowsOffset + AlignUp(rows * rowBytes, kAlign);
    m.scalesOffset = m.idsOffset + AlignUp(routingBytes, kAlign);
    m.totalBytes = m.scalesOffset + routingBytes;
    return m;
}

// ---- state ---------------------------------------------------------------------------------

// Words of the per-group state tensor, and where field f of peer index i lies.
AFD_FN uint32_t StateWords(uint32_t slots) { return kStateFields * slots; }
enum StateField : uint32_t { kStateCalls = 0, kStateSent = 1, kStateTaken = 2 };
AFD_FN uint32_t StateIndex(StateField field, uint32_t peer, uint32_t slots)
{
    return static_cast<uint32_t>(field) * slots + peer;
}

}  // namespace afd
