// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): scalar reads and writes of GM words that another
// core, another rank or the host writes or reads (control words, headers, the state, the status,
// the copy plan, the stop word).
//
// The AI Core's scalar unit reaches GM through its data cache, which nothing keeps coherent with
// other cores, ranks or the host: a read first cleans and invalidates the words' cache lines (so
// the value comes from memory), a write is cleaned out of the cache right after it. Bulk data
// moves with DataCopy (MTE), which does not go through that cache.
//
// Ordering. Every dcci is fenced by compiler barriers (an empty volatile asm that clobbers
// memory), so the compiler neither drops it nor moves a load or store of the words across it;
// DrainWrites() is the hardware side: after it, every write this core issued (MTE copies,
// scalar stores, cache-line cleans) has reached memory. A flag that announces data is written
// only after a DrainWrites() that follows the data.
// AscendC device code; its syntax is checked against the public AscendC headers in CPU-debug
// mode (csrc/README.md); never built for or run on an NPU here.
#pragma once

#include "kernel_operator.h"

#include "afd_portable.h"

namespace afd {
namespace kernel {

constexpr uint32_t kCacheLineBytes = 64;

// Cleans and invalidates every data-cache line that holds part of `count` values from `addr`
// (a few words may straddle a line boundary, e.g. a copy-plan segment).
template <typename T>
__aicore__ inline void SyncLines(__gm__ T* addr, uint32_t count)
{
    uint64_t begin = reinterpret_cast<uint64_t>(addr) / kCacheLineBytes * kCacheLineBytes;
    uint64_t end = reinterpret_cast<uint64_t>(addr) + count * sizeof(T);
    AscendC::GlobalTensor<uint8_t> lines;
    lines.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(begin), end - begin);
    for (uint64_t offset = 0; begin + offset < end; offset += kCacheLineBytes) {
        __asm__ __volatile__("" ::: "memory");
        AscendC::DataCacheCleanAndInvalid<uint8_t, AscendC::CacheLine::SINGLE_CACHE_LINE,
                                          AscendC::DcciDst::CACHELINE_OUT>(lines[offset]);
        __asm__ __volatile__("" ::: "memory");
    }
}

// Waits until every pipe of this core has run what it was given (PipeBarrier) and every memory
// write that issued has completed (DataSyncBarrier, the dsb): the payload before its flag.
__aicore__ inline void DrainWrites()
{
    AscendC::PipeBarrier<PIPE_ALL>();
    AscendC::DataSyncBarrier<AscendC::MemDsbT::ALL>();
}

template <typename T>
__aicore__ inline void LoadWords(__gm__ T* addr, T* values, uint32_t count)
{
    SyncLines(addr, count);
    AscendC::GlobalTensor<T> words;
    words.SetGlobalBuffer(addr, count);
    for (uint32_t i = 0; i < count; ++i) {
        values[i] = words.GetValue(i);
    }
}

template <typename T>
__aicore__ inline void StoreWords(__gm__ T* addr, const T* values, uint32_t count)
{
    AscendC::GlobalTensor<T> words;
    words.SetGlobalBuffer(addr, count);
    for (uint32_t i = 0; i < count; ++i) {
        words.SetValue(i, values[i]);
    }
    SyncLines(addr, count);
}

template <typename T>
__aicore__ inline T LoadWord(__gm__ T* addr)
{
    T value;
    LoadWords(addr, &value, 1);
    return value;
}

template <typename T>
__aicore__ inline void StoreWord(__gm__ T* addr, T value)
{
    StoreWords(addr, &value, 1);
}

// GM address arithmetic on byte pointers.
template <typename T>
__aicore__ inline __gm__ T* At(GM_ADDR base, uint64_t byteOffset)
{
    return reinterpret_cast<__gm__ T*>(base + byteOffset);
}

}  // namespace kernel
}  // namespace afd
