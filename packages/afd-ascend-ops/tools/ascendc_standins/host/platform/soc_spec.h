// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for platform/soc_spec.h of CANN's
// platform package, which is not published. asc-devkit's tiling/platform/platform_ascendc.h
// includes it and declares what it uses of it itself (enum class NpuArch), so it may be empty.
#pragma once
