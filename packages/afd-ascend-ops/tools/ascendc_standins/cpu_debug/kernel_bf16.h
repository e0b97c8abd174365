// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for kernel_bf16.h of CANN's unpublished
// tikicpulib; what the public AscendC headers need of it is in stub_def.h here.
#pragma once

#include "stub_def.h"
