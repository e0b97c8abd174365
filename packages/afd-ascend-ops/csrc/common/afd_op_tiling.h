// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the tiling data of a2e and e2a (one struct for
// both ops), as the CANN MC2 convention wants it: the HCCL init and communication tilings
// first (the kernel's Hccl object is initialised from them and from the HCCL context of the
// op's group, group_ep), then our own arguments.
//
// Needs CANN (>= 8.1, for tiling data declared as a plain C++ struct): the Mc2InitTiling and
// Mc2CcTiling types come from tiling/tiling_api.h on the host and kernel_tiling/kernel_tiling.h
// on the device. Never compiled here (no CANN toolkit was available).
#pragma once

#ifdef __CCE_AICORE__
#include "kernel_tiling/kernel_tiling.h"
#else
#include "tiling/tiling_api.h"
#endif

#include "afd_tiling.h"

namespace afd {

struct OpTilingData {
    Mc2InitTiling mc2InitTiling;
    Mc2CcTiling mc2CcTiling;
    ExchangeTiling exchange;
};

}  // namespace afd
