// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the SoCs the compiled a2e/e2a are built for, and
// per SoC how the MC2 framework binds the group_ep communicator (the HCCL op type and algorithm
// of AscendC::Mc2CcTilingConfig). One table, read by the op_host code through
// op_host/afd_build_target.h (the SoC a package is built for: the one its op definitions declare
// a kernel for, and the op type its tiling binds) and by the binding (the start-up refusal of
// an NPU that has no kernel). Keep op_registry.json in step (a unit test compares them). Plain
// C++17, no CANN.
//
// Only Atlas A3 (ascend910_93) is here. Atlas A2 (ascend910b) is refused at open_group, naming
// kNoKernelReason: the kernels write straight into the peers' HCCL windows (MTE copies to peer
// HBM), which the public A3 MC2 kernels do and the public A2 ones do not (they stage data in
// their own window and hand it to HCCL BatchWrite), and CANN lists no ALLTOALLV op type for
// A2's Mc2CcTilingConfig. An A2 row needs both shown on hardware first (csrc/README.md).
#pragma once

#include "afd_portable.h"

namespace afd {

// The values of AscendC::HcclCMDType (lib/hccl/hccl_common.h) that Mc2CcTilingConfig takes.
// HcclCMDType is an enum class, which does not convert to the uint32_t the constructor takes:
// the value is passed as a number (the real-header check compares it with the enum).
constexpr uint32_t kHcclCmdAllToAllV = 8;  // HcclCMDType::HCCL_CMD_ALLTOALLV

struct SocTarget {
    const char* buildName;      // msopgen's SoC name (op_registry.json, AddConfig, AFD_BUILD_SOC)
    const char* devicePrefix;   // what aclrtGetSocName() starts with on that SoC
    uint32_t hcclOpType;        // Mc2CcTilingConfig's op type for group_ep (no collective runs)
    const char* hcclAlgConfig;  // and its algorithm string
};

constexpr SocTarget kSocTargets[] = {
    {"ascend910_93", "Ascend910_93", kHcclCmdAllToAllV, "AlltoAll=level0:fullmesh;level1:pairwise"},
};
constexpr uint32_t kSocTargetCount = sizeof(kSocTargets) / sizeof(kSocTargets[0]);

constexpr const char* kNoKernelReason =
    "the compiled a2e/e2a are built for Atlas A3 (ascend910_93) only: they write straight into "
    "the peer ranks' HCCL windows, which is shown for A3's MC2 kernels and not for Atlas A2 "
    "(ascend910b), whose MC2 op types also lack the all-to-all the A3 build binds; on other "
    "NPUs use the CPU reference ops, or add the SoC after checking both on hardware "
    "(packages/afd-ascend-ops/csrc/README.md)";

// Whether `text` begins with `prefix`.
AFD_FN constexpr bool StartsWith(const char* text, const char* prefix)
{
    for (; *prefix != '\0'; ++text, ++prefix) {
        if (*text != *prefix) {
            return false;
        }
    }
    return true;
}

// Whether a and b are the same string.
AFD_FN constexpr bool SameName(const char* a, const char* b)
{
    return StartsWith(a, b) && StartsWith(b, a);
}

// The index of a build SoC name's row, or -1.
AFD_FN constexpr int32_t SocTargetIndex(const char* buildName)
{
    for (uint32_t i = 0; i < kSocTargetCount; ++i) {
        if (SameName(kSocTargets[i].buildName, buildName)) {
            return static_cast<int32_t>(i);
        }
    }
    return -1;
}

// The row of the NPU whose aclrtGetSocName() is `deviceName`, or nullptr (no kernel for it).
AFD_FN const SocTarget* SocTargetOfDevice(const char* deviceName)
{
    for (uint32_t i = 0; deviceName != nullptr && i < kSocTargetCount; ++i) {
        if (StartsWith(deviceName, kSocTargets[i].devicePrefix)) {
            return &kSocTargets[i];
        }
    }
    return nullptr;
}

}  // namespace afd
