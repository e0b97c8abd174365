// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the kernel-side CANN API that csrc/ calls, pinned.
// tools/check_kernel_syntax.py compiles this file against the committed stubs (CI) and against
// the real AscendC headers (the real-header check): every assertion must hold for both, so a
// stub that accepts what the real header rejects, or names a type the real header does not
// have, fails one of the two compiles. One line per property our kernels rely on.
#include <cstddef>
#include <type_traits>

#include "kernel_operator.h"
#include "kernel_tiling/kernel_tiling.h"
#include "lib/hccl/hccl.h"

#include "afd_op_tiling.h"
#include "afd_socs.h"

namespace afd_probe {

using namespace AscendC;
using U8 = uint8_t;
using HcclAicpu = Hccl<HcclServerType::HCCL_SERVER_TYPE_AICPU>;

// HCCL op types: an enum class (no conversion to the uint32_t Mc2CcTilingConfig takes), and the
// value afd_socs.h passes for A3 is its ALLTOALLV.
static_assert(std::is_enum_v<HcclCMDType> && !std::is_convertible_v<HcclCMDType, uint32_t>,
              "HcclCMDType is an enum class");
static_assert(static_cast<uint32_t>(HcclCMDType::HCCL_CMD_ALLTOALLV) == afd::kHcclCmdAllToAllV,
              "afd::kHcclCmdAllToAllV is HcclCMDType::HCCL_CMD_ALLTOALLV");
static_assert(std::is_same_v<decltype(HCCL_GROUP_ID_0), const uint32_t>, "group id 0");

// The Hccl client: InitV2 takes the tiling's local address, SetCcTilingV2 an offset in it.
static_assert(std::is_same_v<decltype(&HcclAicpu::InitV2), void (HcclAicpu::*)(GM_ADDR, const void*)>,
              "Hccl::InitV2(GM_ADDR context, const void* initTiling)");
static_assert(std::is_same_v<decltype(&HcclAicpu::SetCcTilingV2), int32_t (HcclAicpu::*)(uint64_t)>,
              "Hccl::SetCcTilingV2(uint64_t offset) -> int32_t");
static_assert(std::is_same_v<decltype(&HcclAicpu::GetWindowsInAddr), GM_ADDR (HcclAicpu::*)(uint32_t)>,
              "Hccl::GetWindowsInAddr(uint32_t rankId) -> GM_ADDR");
static_assert(std::is_same_v<decltype(GetHcclContext<HCCL_GROUP_ID_0>()), GM_ADDR>,
              "GetHcclContext<index>() -> GM_ADDR");

// A3's HCCL context: the window size the kernel checks, where it lies.
static_assert(std::is_same_v<decltype(HcclContextDef::HcclOpResParam::winSize), uint64_t> &&
                  offsetof(HcclContextDef::HcclOpResParam, winSize) == 24,
              "HcclOpResParam::winSize, a uint64_t at byte 24");

// The MC2 tilings at the head of afd::OpTilingData, at CANN's sizes.
static_assert(sizeof(::Mc2InitTiling) == 64 && sizeof(::Mc2CcTiling) == 512, "MC2 tiling sizes");
static_assert(std::is_same_v<::Mc2InitTiling, tiling::Mc2InitTiling>, "::Mc2InitTiling");
static_assert(offsetof(afd::OpTilingData, mc2InitTiling) == 0, "the init tiling comes first");

// Copies through the UB.
static_assert(std::is_same_v<decltype(static_cast<void (*)(const LocalTensor<U8>&, const GlobalTensor<U8>&,
                                                            const DataCopyExtParams&,
                                                            const DataCopyPadExtParams<U8>&)>(
                                 &DataCopyPad<U8>)),
                             void (*)(const LocalTensor<U8>&, const GlobalTensor<U8>&,
                                      const DataCopyExtParams&, const DataCopyPadExtParams<U8>&)>,
              "DataCopyPad GM -> UB with DataCopyExtParams and DataCopyPadExtParams<T>");
static_assert(std::is_same_v<decltype(static_cast<void (*)(const GlobalTensor<U8>&, const LocalTensor<U8>&,
                                                            const DataCopyExtParams&)>(&DataCopyPad<U8>)),
                             void (*)(const GlobalTensor<U8>&, const LocalTensor<U8>&,
                                      const DataCopyExtParams&)>,
              "DataCopyPad UB -> GM with DataCopyExtParams");
static_assert(std::is_constructible_v<DataCopyExtParams, uint16_t, uint32_t, uint32_t, uint32_t, uint32_t>,
              "DataCopyExtParams{blockCount, blockLen, srcStride, dstStride, rsv}");
static_assert(std::is_constructible_v<DataCopyPadExtParams<U8>, bool, uint8_t, uint8_t, U8>,
              "DataCopyPadExtParams<T>{isPad, leftPadding, rightPadding, paddingValue}");
static_assert(std::is_same_v<decltype(std::declval<TQueBind<TPosition::VECIN, TPosition::VECOUT, 2>&>()
                                          .AllocTensor<U8>()),
                             LocalTensor<U8>>,
              "TQueBind<VECIN, VECOUT, depth>::AllocTensor<T>() -> LocalTensor<T>");
static_assert(std::is_same_v<decltype(std::declval<TPipe&>().InitBuffer(
                                 std::declval<TQueBind<TPosition::VECIN, TPosition::VECOUT, 2>&>(),
                                 uint8_t{2}, uint32_t{1})),
                             bool>,
              "TPipe::InitBuffer(que, num, len) -> bool");

// Scalar GM words and cache maintenance.
static_assert(std::is_same_v<decltype(&GlobalTensor<uint32_t>::SetValue),
                             void (GlobalTensor<uint32_t>::*)(const uint64_t, uint32_t)>,
              "GlobalTensor<T>::SetValue(uint64_t, T)");
static_assert(std::is_same_v<decltype(std::declval<GlobalTensor<uint32_t>&>().GetValue(uint64_t{0})),
                             uint32_t>,
              "GlobalTensor<T>::GetValue(uint64_t) -> T");
static_assert(std::is_enum_v<CacheLine> && !std::is_convertible_v<CacheLine, uint64_t> &&
                  std::is_enum_v<DcciDst> && !std::is_convertible_v<DcciDst, uint64_t>,
              "CacheLine and DcciDst are enum classes");
using DcciGm = void (*)(const GlobalTensor<U8>&);
static_assert(std::is_same_v<decltype(static_cast<DcciGm>(
                                 &DataCacheCleanAndInvalid<U8, CacheLine::SINGLE_CACHE_LINE,
                                                           DcciDst::CACHELINE_OUT>)),
                             DcciGm>,
              "DataCacheCleanAndInvalid<T, CacheLine, DcciDst>(const GlobalTensor<T>&)");

// Barriers and the core's place.
static_assert(std::is_enum_v<MemDsbT> && !std::is_convertible_v<MemDsbT, uint8_t>,
              "MemDsbT is an enum class");
static_assert(std::is_same_v<decltype(&DataSyncBarrier<MemDsbT::ALL>), void (*)()>,
              "DataSyncBarrier<MemDsbT>()");
static_assert(std::is_same_v<decltype(&PipeBarrier<PIPE_ALL>), void (*)()>, "PipeBarrier<pipe_t>()");
static_assert(std::is_same_v<decltype(static_cast<void (*)()>(&SyncAll<true>)), void (*)()>,
              "SyncAll<isAIVOnly>()");
static_assert(std::is_same_v<decltype(&GetBlockIdx), int64_t (*)()> &&
                  std::is_same_v<decltype(&GetBlockNum), int64_t (*)()>,
              "GetBlockIdx(), GetBlockNum() -> int64_t");
static_assert(std::is_same_v<decltype(&GetUserWorkspace), GM_ADDR (*)(GM_ADDR)>,
              "GetUserWorkspace(GM_ADDR) -> GM_ADDR");

}  // namespace afd_probe
