// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a2e's shape and dtype inference from the shared
// statement of its output shapes. Needs the CANN host headers; syntax-checked only.
#include "a2e_shape.h"

#include "afd_shape_host.h"
#include "a2e_tiling.h"

namespace ge {

ge::graphStatus InferShapeA2e(gert::InferShapeContext* context)
{
    using afd::host::IntAttr;
    using namespace optiling;
    afd::World world{};
    if (!afd::host::ReadWorld(context, kA2eExpertRankSize, kA2eAttentionRankSize, kA2eRank,
                              &world)) {
        return ge::GRAPH_FAILED;
    }
    afd::A2eShapes shapes = afd::A2eOutputShapes(
        world, IntAttr(context, kA2eBatchSize), IntAttr(context, kA2eHiddenSize),
        IntAttr(context, kA2eTopk), IntAttr(context, kA2eComputeGate) != 0);
    afd::host::SetShape(context->GetOutputShape(kA2eExpandX), shapes.expandX);
    afd::host::SetShape(context->GetOutputShape(kA2eExpandExpertIds), shapes.expertIds);
    afd::host::SetShape(context->GetOutputShape(kA2eExpandScales), shapes.scales);
    afd::host::SetShape(context->GetOutputShape(kA2eAttenBatchSize), shapes.attenBatchSize);
    afd::host::SetShape(context->GetOutputShape(kA2eStatus), afd::StatusShape());
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeA2e(gert::InferDataTypeContext* context)
{
    using namespace optiling;
    context->SetOutputDataType(kA2eExpandX, context->GetInputDataType(kA2eX));
    context->SetOutputDataType(kA2eExpandExpertIds, ge::DT_INT32);
    context->SetOutputDataType(kA2eExpandScales, ge::DT_FLOAT);
    context->SetOutputDataType(kA2eAttenBatchSize, ge::DT_INT32);
    context->SetOutputDataType(kA2eStatus, ge::DT_INT64);
    return ge::GRAPH_SUCCESS;
}

}  // namespace ge
