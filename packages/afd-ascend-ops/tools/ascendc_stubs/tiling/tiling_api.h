// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's tiling/tiling_api.h (see
// register/op_def_registry.h here for what these stubs are and how they are kept true). CANN's
// includes every tiling API; of those the op_host files use the platform and HCCL ones.
#pragma once

#include "tiling/hccl/hccl_tiling.h"
#include "tiling/platform/platform_ascendc.h"
