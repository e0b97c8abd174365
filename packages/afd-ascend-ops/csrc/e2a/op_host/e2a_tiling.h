// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): e2a's parameters by index (the order e2a_def.cpp
// defines them in, which is also the order of the generated aclnnE2a's parameters) and its
// tiling function. Needs the CANN host headers; syntax-checked only.
#pragma once

#include "register/op_def_registry.h"

namespace optiling {

enum E2aInput : size_t { kE2aExpandX = 0, kE2aAttenBatchSize = 1, kE2aState = 2 };

enum E2aOutput : size_t { kE2aY = 0, kE2aStatus = 1 };

enum E2aAttr : size_t {
    kE2aBatchSize = 0,
    kE2aHiddenSize = 1,
    kE2aTopk = 2,
    kE2aExpertRankSize = 3,
    kE2aAttentionRankSize = 4,
    kE2aRank = 5,
    kE2aGroupEp = 6,
    kE2aAivNum = 7,
    kE2aTimeoutMs = 8,
    kE2aStopAddr = 9,
};

// Fills afd::OpTilingData for one e2a launch (see common/op_host/afd_tiling_host.h).
ge::graphStatus TilingE2a(gert::TilingContext* context);

}  // namespace optiling
