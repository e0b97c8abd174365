// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the output shapes of a2e and e2a per role, the
// single host-side statement of afd_ascend_ops/fake.py. The binding allocates its outputs
// with them, the op_host shape inference reports them. Host C++17 only.
//
//   a2e, FFN        expand_x [batch_size, H], expert_ids/scales [batch_size, topk] when gated
//                   else [1, 1], atten_batch_size [ceil(A/F)], x_active_mask [batch_size]
//   a2e, attention  [1, 1], [1, 1], [1, 1], atten_batch_size [ceil(A/F)], x_active_mask [1]
//   e2a, FFN        [1, 1]
//   e2a, attention  [rows of expand_x, H]
// Beside them, what the kernels need and the binding allocates: the status [kStatusWords] int64
// and the per-group state [StateWords(ceil(A/F))] int64.
#pragma once

#include "afd_mailbox.h"
#include "afd_protocol.h"

namespace afd {

struct Dims {
    uint32_t rank;  // 1 or 2
    int64_t d0;
    int64_t d1;     // 0 when rank is 1
};

AFD_FN Dims Dims1(int64_t d0) { return Dims{1, d0, 0}; }
AFD_FN Dims Dims2(int64_t d0, int64_t d1) { return Dims{2, d0, d1}; }

struct A2eShapes {
    Dims expandX;         // dtype of x
    Dims expertIds;       // int32
    Dims scales;          // float32
    Dims attenBatchSize;  // int32
    Dims xActiveMask;     // bool
};

AFD_FN A2eShapes A2eOutputShapes(const World& world, int64_t batchSize, int64_t hidden,
                                 int64_t topk, bool gated)
{
    Dims counts = Dims1(world.Slots());
    if (!world.IsFfn()) {
        return A2eShapes{Dims2(1, 1), Dims2(1, 1), Dims2(1, 1), counts, Dims1(1)};
    }
    Dims routing = gated ? Dims2(batchSize, topk) : Dims2(1, 1);
    return A2eShapes{Dims2(batchSize, hidden), routing, routing, counts, Dims1(batchSize)};
}

AFD_FN Dims E2aOutputShape(const World& world, int64_t expandRows, int64_t hidden)
{
    return world.IsFfn() ? Dims2(1, 1) : Dims2(expandRows, hidden);
}

AFD_FN Dims StatusShape() { return Dims1(kStatusWords); }
AFD_FN Dims StateShape(const World& world) { return Dims1(StateWords(world.Slots())); }

}  // namespace afd
