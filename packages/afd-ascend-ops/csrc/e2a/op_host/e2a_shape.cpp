// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): e2a's shape and dtype inference from the shared
// statement of its output shapes. Needs the CANN host headers; syntax-checked only.
#include "e2a_shape.h"

#include "afd_shape_host.h"
#include "e2a_tiling.h"

namespace ge {

ge::graphStatus InferShapeE2a(gert::InferShapeContext* context)
{
    using namespace optiling;
    afd::World world{};
    if (!afd::host::ReadWorld(context, kE2aExpertRankSize, kE2aAttentionRankSize, kE2aRank,
                              &world)) {
        return ge::GRAPH_FAILED;
    }
    int64_t rows = context->GetInputShape(kE2aExpandX)->GetDim(0);
    afd::Dims y = afd::E2aOutputShape(world, rows, afd::host::IntAttr(context, kE2aHiddenSize));
    afd::host::SetShape(context->GetOutputShape(kE2aY), y);
    afd::host::SetShape(context->GetOutputShape(kE2aStatus), afd::StatusShape());
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeE2a(gert::InferDataTypeContext* context)
{
    using namespace optiling;
    context->SetOutputDataType(kE2aY, context->GetInputDataType(kE2aExpandX));
    context->SetOutputDataType(kE2aStatus, ge::DT_INT64);
    return ge::GRAPH_SUCCESS;
}

}  // namespace ge
