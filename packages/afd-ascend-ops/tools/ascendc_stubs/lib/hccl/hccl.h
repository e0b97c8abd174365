// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's lib/hccl/hccl.h (see
// kernel_operator.h here for what these stubs are and how they are kept true): the Hccl client
// calls the kernels make, and A3's HCCL context layout (HcclOpResParam), whose winSize they read.
#pragma once

#include "kernel_operator.h"
#include "lib/hccl/hccl_common.h"

namespace AscendC {

static constexpr HcclServerConfig DEFAULT_CFG = {CoreType::DEFAULT, 0};

template <HcclServerType serverType = HcclServerType::HCCL_SERVER_TYPE_AICPU,
          const auto& config = DEFAULT_CFG>
class Hccl {
public:
    __aicore__ inline void InitV2(GM_ADDR context, const void* initTiling) {}
    __aicore__ inline int32_t SetCcTilingV2(uint64_t offset) { return 0; }
    __aicore__ inline GM_ADDR GetWindowsInAddr(uint32_t rankId) { return nullptr; }
};

namespace HcclContextDef {
struct HcclOpResParam {
    uint64_t workSpace;
    uint64_t workSpaceSize;
    uint32_t rankId;
    uint32_t rankNum;
    uint64_t winSize;
    uint64_t localWindowsIn;
    uint64_t localWindowsOut;
    char hcomId[128];
    uint64_t winExpSize;
    uint64_t localWindowsExp;
    uint32_t rWinStart;
};
}  // namespace HcclContextDef

}  // namespace AscendC
