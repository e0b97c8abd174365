// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's kernel_operator.h holding only
// what csrc/'s kernels call, for CI's syntax check (tools/check_kernel_syntax.py), which has no
// CANN. Each declaration has the signature asc-devkit gives it in CPU-debug mode for dav-2201
// (Atlas A2/A3): names, namespaces, enum classes, parameter and return types. They are pinned by
// tools/api_probes/kernel_api_probe.cpp, which the check compiles against these stubs and the
// real-header check against asc-devkit (csrc/README.md has the commit), so a stub that drifts
// from the real header fails one of the two. Bodies are empty: nothing here runs.
#pragma once

#include <cstddef>
#include <cstdint>

// Compiler keywords of bisheng; empty in CPU-debug mode, as here.
#define __aicore__
#define __global__
#define __gm__

#define GM_ADDR __gm__ uint8_t*

// The pipes of an AI Core (a bisheng builtin enum, global).
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };

// Kernel types for KERNEL_TASK_TYPE_DEFAULT (global in asc-devkit).
enum KernelMetaType : uint8_t { KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY };

// In CPU-debug mode both expand to bookkeeping that checks nothing; here they at least require
// a complete tiling type and a known kernel type.
#define REGISTER_TILING_DEFAULT(tiling_struct) \
    static_assert(sizeof(tiling_struct) > 0, "REGISTER_TILING_DEFAULT needs a complete type")
#define KERNEL_TASK_TYPE_DEFAULT(value) \
    static_assert(static_cast<KernelMetaType>(value) == (value), "not a KernelMetaType")

namespace AscendC {

enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC };
enum class CacheLine : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum class MemDsbT : uint8_t { ALL = 0, DDR, UB, SEQ };

template <typename T>
class LocalTensor {
public:
    __aicore__ inline LocalTensor operator[](const uint32_t offset) const { return *this; }
};

template <typename T>
class GlobalTensor {
public:
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {}
    __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer) {}
    __aicore__ inline T GetValue(const uint64_t offset) const { return T(); }
    __aicore__ inline T GetValue(const uint64_t offset) { return T(); }
    __aicore__ inline void SetValue(const uint64_t offset, T value) {}
    __aicore__ inline GlobalTensor operator[](const uint64_t offset) const { return *this; }
};

template <TPosition src, TPosition dst, int32_t depth, auto mask = 0>
class TQueBind {
public:
    template <typename T>
    __aicore__ inline LocalTensor<T> AllocTensor() { return LocalTensor<T>(); }
    template <typename T>
    __aicore__ inline void FreeTensor(LocalTensor<T>& tensor) {}
    template <typename T>
    __aicore__ inline bool EnQue(const LocalTensor<T>& tensor) { return true; }
    template <typename T>
    __aicore__ inline LocalTensor<T> DeQue() { return LocalTensor<T>(); }
};

class TPipe {
public:
    template <class T>
    __aicore__ inline bool InitBuffer(T& que, uint8_t num, uint32_t len) { return true; }
};

struct DataCopyExtParams {
    __aicore__ DataCopyExtParams() {}
    __aicore__ DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn,
                                 const uint32_t dstStrideIn, const uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn),
          rsv(rsvIn)
    {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    __aicore__ DataCopyPadExtParams() {}
    __aicore__ DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue,
                                    const uint8_t rightPadValue, T padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue),
          paddingValue(padValue)
    {}
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue = 0;
};

template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                   const DataCopyExtParams& dataCopyParams,
                                   const DataCopyPadExtParams<T>& padParams)
{}

template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& dataCopyParams)
{}

template <pipe_t pipe>
__aicore__ inline void PipeBarrier() {}

template <MemDsbT arg0>
__aicore__ inline void DataSyncBarrier() {}

template <bool isAIVOnly = true>
__aicore__ inline void SyncAll() {}

__aicore__ inline int64_t GetBlockNum() { return 1; }
__aicore__ inline int64_t GetBlockIdx() { return 0; }
__aicore__ inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) { return workspace; }

template <typename T, CacheLine entireType, DcciDst dcciDst>
__aicore__ inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst) {}

template <uint32_t index>
__aicore__ inline __gm__ uint8_t* __gm__ GetHcclContext(void) { return nullptr; }

}  // namespace AscendC
