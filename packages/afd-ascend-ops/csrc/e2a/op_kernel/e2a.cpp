// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the e2a kernel (experts to attention).
//
//   FFN rank        splits expand_x by atten_batch_size (output [3] of the matching a2e: one
//                   count per block member, -1 for one that took no part, zeros past the block;
//                   the counts must sum to expand_x's rows and to batch_size) and sends each
//                   member that took part its rows; it does not wait for them to be taken.
//   attention rank  receives the FFN's message for it, checks the header (exactly the rows it
//                   sent with a2e, which the binding checked against expand_x) and copies the
//                   rows into y.
//
// The protocol itself is common/op_kernel/afd_exchange.h. AscendC device code; never built or
// run here (no CANN toolkit or Ascend device); syntax-checked only (csrc/README.md).
#include "kernel_operator.h"

#include "afd_op_tiling.h"
#include "afd_exchange.h"

using afd::kernel::Exchange;
using afd::kernel::Peers;

namespace {

// FFN e2a, leader: the members that took part and their rows, from atten_batch_size, checked
// to be what a2e returned and to agree with expand_x and batch_size.
__aicore__ inline void MembersFromCounts(Exchange& exchange, const afd::ExchangeTiling& t,
                                         GM_ADDR attenBatchSize, Peers* peers)
{
    const afd::World& world = exchange.GetWorld();
    int32_t counts[afd::kMaxPeers];
    afd::kernel::LoadWords(afd::kernel::At<int32_t>(attenBatchSize, 0), counts, world.Slots());
    int64_t sum = 0;
    peers->count = 0;
    for (uint32_t i = 0; i < world.Slots(); ++i) {
        bool member = i < world.PeerCount();
        if ((member && counts[i] < -1) || (!member && counts[i] != 0)) {
            exchange.Fail(afd::kStatusBadCounts, -1, i, counts[i], world.PeerCount());
            return;
        }
        if (member && counts[i] >= 0) {
            peers->index[peers->count] = i;
            peers->rows[peers->count] = counts[i];
            ++peers->count;
            sum += counts[i];
        }
    }
    if (sum != t.rows || sum != t.batchSize) {
        exchange.Fail(afd::kStatusCountRows, -1, sum, t.rows, t.batchSize);
    }
}

}  // namespace

extern "C" __global__ __aicore__ void e2a(GM_ADDR expandX, GM_ADDR attenBatchSize, GM_ADDR state,
                                          GM_ADDR y, GM_ADDR status, GM_ADDR workspace,
                                          GM_ADDR tiling)
{
    REGISTER_TILING_DEFAULT(afd::OpTilingData);
    GET_TILING_DATA_WITH_STRUCT(afd::OpTilingData, tilingData, tiling);
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    const afd::ExchangeTiling& t = tilingData.exchange;

    AscendC::TPipe pipe;
    Exchange exchange;
    exchange.Init(tilingData, state, status, workspace, &pipe);

    Peers peers;
    peers.count = 0;
    if (exchange.GetWorld().IsFfn()) {
        if (exchange.IsLeader()) {
            MembersFromCounts(exchange, t, attenBatchSize, &peers);
        }
        afd::kernel::Buffers from{expandX, nullptr, nullptr};
        exchange.Send(afd::kOpE2a, peers, from);
    } else {
        exchange.OnlyPeer(t.rows, &peers);
        afd::kernel::Buffers to{y, nullptr, nullptr};
        exchange.Receive(afd::kOpE2a, peers, to, afd::kernel::kAnyRows);
    }
    exchange.Finish();
}
