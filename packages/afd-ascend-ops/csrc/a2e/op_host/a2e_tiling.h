// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a2e's parameters by index (the order a2e_def.cpp
// defines them in, which is also the order of the generated aclnnA2e's parameters) and its
// tiling function. Needs the CANN host headers; syntax-checked only.
#pragma once

#include "register/op_def_registry.h"

namespace optiling {

enum A2eInput : size_t { kA2eX = 0, kA2eExpertIds = 1, kA2eScales = 2, kA2eState = 3 };

enum A2eOutput : size_t {
    kA2eExpandX = 0,
    kA2eExpandExpertIds = 1,
    kA2eExpandScales = 2,
    kA2eAttenBatchSize = 3,
    kA2eStatus = 4,
};

enum A2eAttr : size_t {
    kA2eBatchSize = 0,
    kA2eHiddenSize = 1,
    kA2eTopk = 2,
    kA2eExpertRankSize = 3,
    kA2eAttentionRankSize = 4,
    kA2eRank = 5,
    kA2eGroupEp = 6,
    kA2eAivNum = 7,
    kA2eComputeGate = 8,
    kA2eMode = 9,
    kA2eTimeoutMs = 10,
    kA2eStopAddr = 11,
};

// Fills afd::OpTilingData for one a2e launch (see common/op_host/afd_tiling_host.h).
ge::graphStatus TilingA2e(gert::TilingContext* context);

}  // namespace optiling
