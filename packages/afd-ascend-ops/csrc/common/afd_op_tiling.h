// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the tiling data of a2e and e2a (one struct for
// both ops), as the CANN MC2 convention wants it: the HCCL init and communication tilings
// first (the kernel's Hccl object is initialised from them and from the HCCL context of the
// op's group, group_ep), then our own arguments.
//
// Needs CANN (>= 8.1, for tiling data declared as a plain C++ struct): the Mc2InitTiling and
// Mc2CcTiling types come from kernel_tiling/kernel_tiling.h on the host and in the kernel alike
// (a header CANN generates from its tiling data definitions: ::Mc2InitTiling, ::Mc2CcTiling, the
// types Mc2CcTilingConfig::GetTiling fills), so both sides see one layout.
#pragma once

#include "kernel_tiling/kernel_tiling.h"

#include "afd_tiling.h"

namespace afd {

struct OpTilingData {
    Mc2InitTiling mc2InitTiling;
    Mc2CcTiling mc2CcTiling;
    ExchangeTiling exchange;
};

}  // namespace afd
