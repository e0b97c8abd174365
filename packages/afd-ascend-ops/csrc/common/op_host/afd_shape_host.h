// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): what both ops' shape inference share: reading
// the world from the attributes and writing an afd::Dims (afd_shapes.h, the one statement of
// the output shapes) into a gert::Shape. Header only, like afd_tiling_host.h.
// Needs the CANN host headers; never built here (syntax-checked only, csrc/README.md).
#pragma once

#include "register/op_def_registry.h"

#include "afd_shapes.h"
#include "afd_attrs_host.h"

namespace afd {
namespace host {

// The world of an op whose attributes hold F, A and rank at these indices; false when they
// cannot form one (the tiling rejects such a call with a message).
inline bool ReadWorld(const gert::InferShapeContext* context, size_t ffnIndex,
                      size_t attentionIndex, size_t rankIndex, World* world)
{
    int64_t f = IntAttr(context, ffnIndex);
    int64_t a = IntAttr(context, attentionIndex);
    int64_t rank = IntAttr(context, rankIndex);
    if (f < 1 || a < f || rank < 0 || rank >= a + f) {
        return false;
    }
    *world = World{static_cast<uint32_t>(f), static_cast<uint32_t>(a), static_cast<uint32_t>(rank)};
    return true;
}

inline void SetShape(gert::Shape* shape, const Dims& dims)
{
    shape->SetDimNum(dims.rank);
    shape->SetDim(0, dims.d0);
    if (dims.rank == 2) {
        shape->SetDim(1, dims.d1);
    }
}

}  // namespace host
}  // namespace afd
