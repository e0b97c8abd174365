// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's
// tiling/platform/platform_ascendc.h (see register/op_def_registry.h here for what these stubs
// are and how they are kept true): the platform queries the tiling makes.
#pragma once

#include <cstdint>

namespace fe {
class PlatFormInfos;
}  // namespace fe

namespace platform_ascendc {

class PlatformAscendC {
public:
    PlatformAscendC() = delete;
    explicit PlatformAscendC(fe::PlatFormInfos* platformInfo) {}
    uint32_t GetCoreNumAiv(void) const { return 0; }
    uint32_t GetLibApiWorkSpaceSize(void) const { return 0; }
};

}  // namespace platform_ascendc
