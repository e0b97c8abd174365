// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): e2a's tiling: its attributes and inputs into the
// shared afd::host::FillTiling. Needs the CANN host headers; syntax-checked only.
#include "e2a_tiling.h"

#include "afd_tiling.h"
#include "afd_attrs_host.h"
#include "afd_tiling_host.h"

namespace optiling {

ge::graphStatus TilingE2a(gert::TilingContext* context)
{
    using afd::host::IntAttr;
    afd::host::ExchangeArgs args{};
    args.op = "e2a";
    args.batchSize = IntAttr(context, kE2aBatchSize);
    args.hiddenSize = IntAttr(context, kE2aHiddenSize);
    args.topk = IntAttr(context, kE2aTopk);
    args.ffnRanks = IntAttr(context, kE2aExpertRankSize);
    args.attentionRanks = IntAttr(context, kE2aAttentionRankSize);
    args.rank = IntAttr(context, kE2aRank);
    args.groupEp = afd::host::StringAttr(context, kE2aGroupEp);
    args.aivNum = IntAttr(context, kE2aAivNum);
    args.computeGate = 0;  // results travel without routing
    args.mode = afd::kModeExchange;
    args.timeoutMs = IntAttr(context, kE2aTimeoutMs);
    args.stopAddr = IntAttr(context, kE2aStopAddr);
    args.rows = context->GetInputShape(kE2aExpandX)->GetStorageShape().GetDim(0);
    args.dtype = context->GetInputDesc(kE2aExpandX)->GetDataType();
    args.hasExpected = false;
    return afd::host::FillTiling(context, args);
}

}  // namespace optiling
