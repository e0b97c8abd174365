// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the a2e kernel (attention to experts).
//
//   attention rank  sends its x rows (and, gated, expert ids and scales) to its FFN rank's
//                   window and returns without waiting for the FFN; atten_batch_size gets its
//                   own row count at its place in the block, zeros elsewhere.
//   FFN rank        receives the message of every block member taking part (all, or those
//                   whose entry of expert_ids is not -1; with expert_ids each count is checked
//                   too), checks every header and that the counts sum to batch_size, then
//                   copies the rows into expand_x in block order (routing into expand_expert_ids
//                   and expand_scales when gated); atten_batch_size gets each member's count,
//                   -1 for a member that took no part, zeros past the block.
//   reset mode      zeroes this rank's mailbox control words (once, when the group opens).
//
// The protocol itself is common/op_kernel/afd_exchange.h. AscendC device code; never built or
// run here (no CANN toolkit or Ascend device); syntax-checked only (csrc/README.md).
#include "kernel_operator.h"

#include "afd_op_tiling.h"
#include "afd_exchange.h"

using afd::kernel::Exchange;
using afd::kernel::Peers;

namespace {

// FFN a2e, leader: the block members taking part and the rows expected of each. Without
// expected counts every member takes part with any count.
__aicore__ inline void BlockMembers(Exchange& exchange, const afd::ExchangeTiling& t,
                                    GM_ADDR expected, Peers* peers)
{
    const afd::World& world = exchange.GetWorld();
    int32_t counts[afd::kMaxPeers];
    if (t.hasExpected != 0) {
        afd::kernel::LoadWords(afd::kernel::At<int32_t>(expected, 0), counts, world.PeerCount());
    }
    peers->count = 0;
    for (uint32_t i = 0; i < world.PeerCount(); ++i) {
        int64_t rows = t.hasExpected != 0 ? counts[i] : afd::kernel::kAnyRows;
        if (t.hasExpected != 0 && rows < -1) {
            exchange.Fail(afd::kStatusBadExpected, -1, i, rows, 0);
            return;
        }
        if (rows == -1) {
            continue;  // takes no part in this call
        }
        peers->index[peers->count] = i;
        peers->rows[peers->count] = rows;
        ++peers->count;
    }
}

// Leader: atten_batch_size. FFN: the rows each member sent, -1 for one that took no part, zeros
// past the block. Attention: its own rows at its place in its FFN rank's block, zeros elsewhere.
__aicore__ inline void WriteCounts(const Exchange& exchange, const afd::ExchangeTiling& t,
                                   const Peers& peers, GM_ADDR out)
{
    const afd::World& world = exchange.GetWorld();
    int32_t counts[afd::kMaxPeers];
    for (uint32_t i = 0; i < world.Slots(); ++i) {
        counts[i] = (world.IsFfn() && i < world.PeerCount()) ? -1 : 0;
    }
    if (world.IsFfn()) {
        for (uint32_t j = 0; j < peers.count; ++j) {
            counts[peers.index[j]] = static_cast<int32_t>(peers.rows[j]);
        }
    } else {
        counts[world.IndexAtPeer()] = static_cast<int32_t>(t.rows);
    }
    afd::kernel::StoreWords(afd::kernel::At<int32_t>(out, 0), counts, world.Slots());
}

}  // namespace

extern "C" __global__ __aicore__ void a2e(GM_ADDR x, GM_ADDR expertIds, GM_ADDR scales,
                                          GM_ADDR state, GM_ADDR expandX, GM_ADDR expandExpertIds,
                                          GM_ADDR expandScales, GM_ADDR attenBatchSize,
                                          GM_ADDR status, GM_ADDR workspace, GM_ADDR tiling)
{
    REGISTER_TILING_DEFAULT(afd::OpTilingData);
    GET_TILING_DATA_WITH_STRUCT(afd::OpTilingData, tilingData, tiling);
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    const afd::ExchangeTiling& t = tilingData.exchange;

    AscendC::TPipe pipe;
    Exchange exchange;
    exchange.Init(tilingData, state, status, workspace, &pipe);
    if (t.mode == afd::kModeReset) {
        exchange.Reset();
        exchange.Finish();
        return;
    }

    Peers peers;
    peers.count = 0;
    if (exchange.GetWorld().IsFfn()) {
        if (exchange.IsLeader()) {
            BlockMembers(exchange, t, expertIds, &peers);
        }
        afd::kernel::Buffers to{expandX, expandExpertIds, expandScales};
        exchange.Receive(afd::kOpA2e, peers, to, t.batchSize);
    } else {
        exchange.OnlyPeer(t.rows, &peers);
        afd::kernel::Buffers from{x, expertIds, scales};
        exchange.Send(afd::kOpA2e, peers, from);
    }
    // Written on failure too: a count-sum error names each member's count from it.
    if (exchange.IsLeader()) {
        WriteCounts(exchange, t, peers, attenBatchSize);
    }
    exchange.Finish();
}
