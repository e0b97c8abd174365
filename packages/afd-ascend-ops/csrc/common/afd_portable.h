// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): lets the shared headers compile both as AscendC
// device code (bisheng defines __CCE_AICORE__; kernel_operator.h, included first, brings the
// fixed-width integer types) and as host C++17 (g++: op_host tiling and the torch binding).
#pragma once

#ifdef __CCE_AICORE__
// A function the AI Core calls must carry __aicore__.
#define AFD_FN __aicore__ inline
#else
#include <cstdint>
#define AFD_FN inline
#endif
