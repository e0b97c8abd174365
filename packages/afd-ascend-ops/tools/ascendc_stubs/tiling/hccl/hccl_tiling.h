// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's tiling/hccl/hccl_tiling.h
// (see register/op_def_registry.h here for what these stubs are and how they are kept true).
// The op type is a uint32_t, as in CANN: AscendC::HcclCMDType, an enum class, does not convert
// to it (tests/unit/ascend_ops/test_kernel_syntax.py plants that mistake and sees it fail).
#pragma once

#include <cstdint>
#include <string>

#include "kernel_tiling/kernel_tiling.h"

namespace AscendC {

class Mc2CcTilingConfig {
public:
    explicit Mc2CcTilingConfig(const std::string& groupName, uint32_t opType,
                               const std::string& algConfig, uint32_t reduceType = 0,
                               uint8_t dstDataType = 0, uint8_t srcDataType = 0,
                               uint8_t commEngine = 0)
    {}
    virtual ~Mc2CcTilingConfig() {}
    uint32_t GetTiling(::Mc2InitTiling& tiling) { return 0; }
    uint32_t GetTiling(::Mc2CcTiling& tiling) { return 0; }
};

}  // namespace AscendC
