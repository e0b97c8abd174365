// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for the tiling header CANN's op compiler
// generates for each kernel and includes before it (asc-devkit's
// tools/build/asc_op_compile_base/asc_op_compiler/get_op_tiling.py writes it; the generator needs
// the CANN toolkit to run). In CPU-debug mode it declares a local copy of the tiling struct and
// fills it from the launch's tiling argument; GET_TILING_DATA_WITH_STRUCT is all our kernels use.
#pragma once

#include "kernel_operator.h"

template <class T>
inline __aicore__ void InitTilingData(const __gm__ uint8_t* tiling, T* data)
{
    (void)tiling;
    (void)data;
}

#define GET_TILING_DATA_WITH_STRUCT(tiling_struct, tiling_data, tiling_arg) \
    tiling_struct tiling_data;                                              \
    InitTilingData<tiling_struct>(tiling_arg, &tiling_data);
