// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a2e's tiling: its attributes and inputs into the
// shared afd::host::FillTiling. Needs the CANN host headers; syntax-checked only.
#include "a2e_tiling.h"

#include "afd_attrs_host.h"
#include "afd_tiling_host.h"

namespace optiling {

ge::graphStatus TilingA2e(gert::TilingContext* context)
{
    using afd::host::IntAttr;
    afd::host::ExchangeArgs args{};
    args.op = "a2e";
    args.batchSize = IntAttr(context, kA2eBatchSize);
    args.hiddenSize = IntAttr(context, kA2eHiddenSize);
    args.topk = IntAttr(context, kA2eTopk);
    args.ffnRanks = IntAttr(context, kA2eExpertRankSize);
    args.attentionRanks = IntAttr(context, kA2eAttentionRankSize);
    args.rank = IntAttr(context, kA2eRank);
    args.groupEp = afd::host::StringAttr(context, kA2eGroupEp);
    args.aivNum = IntAttr(context, kA2eAivNum);
    args.computeGate = IntAttr(context, kA2eComputeGate);
    args.mode = IntAttr(context, kA2eMode);
    args.timeoutMs = IntAttr(context, kA2eTimeoutMs);
    args.stopAddr = IntAttr(context, kA2eStopAddr);
    args.rows = context->GetInputShape(kA2eX)->GetStorageShape().GetDim(0);
    args.dtype = context->GetInputDesc(kA2eX)->GetDataType();
    // On an FFN rank expert_ids, when given, holds the rows expected from each block member
    // (-1: takes no part); on an attention rank it is the routing that travels when gated.
    args.hasExpected = args.rank < args.ffnRanks &&
                       context->GetOptionalInputShape(kA2eExpertIds) != nullptr;
    return afd::host::FillTiling(context, args);
}

}  // namespace optiling
