// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the SoC this op package is built for. The package
// is built per SoC (build_kernels.sh: one msopgen project per SoC of op_registry.json), and
// build_kernels.sh writes afd_build_soc.h into each project's op_host directory:
//
//   #define AFD_BUILD_SOC "ascend910_93"
//
// Its row of afd_socs.h gives the SoC the op definitions declare a kernel for and the HCCL op
// type the tiling binds group_ep with. Header only; plain C++17.
#pragma once

#include "afd_build_soc.h"
#include "afd_socs.h"

namespace afd {
namespace host {

constexpr int32_t kBuildTargetIndex = SocTargetIndex(AFD_BUILD_SOC);
static_assert(kBuildTargetIndex >= 0,
              "AFD_BUILD_SOC (afd_build_soc.h, written by build_kernels.sh) names no SoC of "
              "afd_socs.h's kSocTargets: add the SoC's row there first");
constexpr const SocTarget& kBuildTarget =
    kSocTargets[kBuildTargetIndex < 0 ? 0 : kBuildTargetIndex];

}  // namespace host
}  // namespace afd
