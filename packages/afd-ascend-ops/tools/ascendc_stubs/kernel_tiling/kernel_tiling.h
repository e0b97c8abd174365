// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for kernel_tiling/kernel_tiling.h, which
// CANN generates from its tiling data definitions (see kernel_operator.h here for what these
// stubs are and how they are kept true): the two MC2 tilings, opaque, at their real sizes, in
// AscendC::tiling and exported to the global namespace as CANN does.
#pragma once

#include <cstdint>

namespace AscendC {
namespace tiling {
struct Mc2InitTiling {
    uint8_t reserved[64] = {};
};
struct Mc2CcTiling {
    uint8_t reserved[512] = {};
};
}  // namespace tiling
}  // namespace AscendC

using AscendC::tiling::Mc2CcTiling;
using AscendC::tiling::Mc2InitTiling;
