// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): moves bytes from GM to GM (local or a peer's
// window) through the Unified Buffer, in chunks, double buffered: the copy-in of one chunk
// (MTE2) overlaps the copy-out of the previous one (MTE3); the queue between VECIN and VECOUT
// carries the synchronisation. Rows, expert ids and scales all move as bytes, so one kernel
// serves every dtype. DataCopyPad takes any byte length (no 32-byte multiple needed).
// AscendC device code; never built here (syntax-checked only, csrc/README.md).
#pragma once

#include "kernel_operator.h"

#include "afd_portable.h"

namespace afd {
namespace kernel {

class ByteMover {
public:
    static constexpr uint32_t kChunkBytes = 64 * 1024;  // 2 chunks of the 192 KiB UB
    static constexpr int32_t kDepth = 2;

    __aicore__ inline void Init(AscendC::TPipe* pipe)
    {
        pipe->InitBuffer(queue_, kDepth, kChunkBytes);
    }

    // Copies `bytes` bytes from `src` to `dst`.
    __aicore__ inline void Copy(GM_ADDR dst, GM_ADDR src, uint64_t bytes)
    {
        AscendC::GlobalTensor<uint8_t> from;
        AscendC::GlobalTensor<uint8_t> to;
        from.SetGlobalBuffer(src, bytes);
        to.SetGlobalBuffer(dst, bytes);
        for (uint64_t offset = 0; offset < bytes; offset += kChunkBytes) {
            uint32_t length = static_cast<uint32_t>(
                bytes - offset < kChunkBytes ? bytes - offset : kChunkBytes);
            AscendC::DataCopyExtParams params{1, length, 0, 0, 0};
            AscendC::LocalTensor<uint8_t> chunk = queue_.AllocTensor<uint8_t>();
            AscendC::DataCopyPad(chunk, from[offset], params,
                                 AscendC::DataCopyPadExtParams<uint8_t>{false, 0, 0, 0});
            queue_.EnQue(chunk);
            chunk = queue_.DeQue<uint8_t>();
            AscendC::DataCopyPad(to[offset], chunk, params);
            queue_.FreeTensor(chunk);
        }
    }

private:
    AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, kDepth> queue_;
};

}  // namespace kernel
}  // namespace afd
