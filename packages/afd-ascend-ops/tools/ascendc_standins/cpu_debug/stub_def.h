// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for stub_def.h of CANN's tikicpulib,
// which is not published (it comes with the CANN toolkit). The public AscendC headers
// (asc-devkit) include it in CPU-debug mode (ASCENDC_CPU_DEBUG=1) for what bisheng otherwise
// builds in: the address-space keywords, the scalar types of the AI Core, and its intrinsics.
// It lets g++ parse the real headers for tools/check_kernel_syntax.py --real-headers; nothing
// here is a CANN signature our code may rely on. Every name below was taken from g++'s errors on
// the public headers at the commit csrc/README.md names, and declared as loosely as they use it:
// a keyword empty, a type a distinct scalar, an intrinsic a function taking anything. csrc/
// never names one of them directly (the check refuses a source that does), so their looseness
// cannot hide an error of ours; every CANN API we call comes from the real headers.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <type_traits>
#include <vector>

// Address spaces and function kinds (bisheng keywords).
#define __aicore__
#define __global__
#define __gm__
#define __ubuf__
#define __cbuf__
#define __ca__
#define __cb__
#define __cc__
#define __fbuf__
#define __ssbuf__
#define __host__
#define __host_aicore__
#define __BLOCK_LOCAL__
#define __simd_callee__
#define __simd_vf__
#define __simt_callee__
#define __simt_vf__
#define __disable_kernel_type_autoinfer__
#define ASCENDC_HOST_AICORE
#define ASCENDC_HOST
#define ASCENDC_AICORE
// Pipe annotations of the compiler.
#define __inout_pipe__(...)
#define __in_pipe__(...)
#define __out_pipe__(...)
#define __sync_alias__
#define __check_sync_alias__

// An AI Core scalar type the host has not got: distinct per name, convertible from numbers.
template <typename Self>
struct AfdCpuScalar {
    uint16_t bits = 0;
    constexpr AfdCpuScalar() = default;
    template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
    constexpr AfdCpuScalar(T) {}
    constexpr operator float() const { return 0.f; }
    constexpr float ToFloat() const { return 0.f; }
};
#define AFD_CPU_SCALAR(name) \
    struct name : AfdCpuScalar<name> { using AfdCpuScalar::AfdCpuScalar; }
// A builtin the headers call: any arguments.
#define AFD_CPU_INTRINSIC(name) \
    template <typename... Args> inline int64_t name(Args&&...) { return 0; }

// Pipes, events and memories (bisheng builtin enums).
// One enum a line: tools/check_kernel_syntax.py reads the names declared here from this file.
enum pipe_t : int { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX, PIPE_NUM };
enum event_t : int { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
enum mem_t : int { L1 = 0, L0A, L0B, L0C, UB, BT };
enum addr_cal_mode_t : int { inc = 0, dec };

// Further builtin enums (only the enumerators the headers name).
enum Order_t : int { VALUE_INDEX, INDEX_VALUE, ONLY_VALUE, ONLY_INDEX };
enum QuantMode_t : int { NoQuant, F322F16, F322BF16, DEQF16, VDEQF16, REQ8, VREQ8, QF322B8_PRE, VQF322B8_PRE, DEQS16, VDEQS16, REQ4, VREQ4 };
enum atomic_op_t : int { atomic_op_t_none };
enum atomic_type_t : int { atomic_type_t_none };
enum cache_line_t : int { SINGLE_CACHE_LINE, ENTIRE_DATA_CACHE };
enum dcci_dst_t : int { CACHELINE_OUT };
enum mem_dsb_t : int { DSB_ALL, DSB_DDR, DSB_UB, DSB_SEQ };
enum pad_t : int { PAD_NONE, PAD_MODE1, PAD_MODE2, PAD_MODE3, PAD_MODE4, PAD_MODE5, PAD_MODE6, PAD_MODE7, PAD_MODE8 };

// Scalar and register types.
AFD_CPU_SCALAR(bfloat16_t);
AFD_CPU_SCALAR(fp4x2_e1m2_t);
AFD_CPU_SCALAR(fp4x2_e2m1_t);
AFD_CPU_SCALAR(fp8_e4m3fn_t);
AFD_CPU_SCALAR(fp8_e5m2_t);
AFD_CPU_SCALAR(fp8_e8m0_t);
AFD_CPU_SCALAR(half);
AFD_CPU_SCALAR(hifloat8_t);
AFD_CPU_SCALAR(int4x2_t);
AFD_CPU_SCALAR(vector_address);
AFD_CPU_SCALAR(vector_align);
AFD_CPU_SCALAR(vector_bool);

// Core-local variables and constants of the simulator.
extern int64_t block_idx;
extern int64_t block_num;
inline int64_t H128 = 0;
inline int64_t L128 = 0;
inline int64_t VA0 = 0;
inline int64_t VA1 = 0;
inline int64_t VA2 = 0;
inline int64_t VA3 = 0;
inline int64_t VA4 = 0;
inline int64_t VA5 = 0;
inline int64_t VA6 = 0;
inline int64_t VA7 = 0;
inline int64_t g_fixpipeNdNzParam = 0;
inline int64_t g_taskRation = 0;
inline int64_t sub_block_idx = 0;
namespace AscendC {
inline int64_t AIC_TYPE = 0;
inline int64_t AIV_TYPE = 0;
inline int64_t g_isVdeq = 0;
}  // namespace AscendC

// Intrinsics.
AFD_CPU_INTRINSIC(AscendCBufAbsAddr)
AFD_CPU_INTRINSIC(AscendCBufAlloc)
AFD_CPU_INTRINSIC(AscendCBufDeque)
AFD_CPU_INTRINSIC(AscendCBufEnque)
AFD_CPU_INTRINSIC(AscendCBufFree)
AFD_CPU_INTRINSIC(AscendCBufGet)
AFD_CPU_INTRINSIC(AscendCBufInit)
AFD_CPU_INTRINSIC(AscendCQueCreate)
AFD_CPU_INTRINSIC(AscendCRecordPoolHierarchy)
AFD_CPU_INTRINSIC(AscendCTBufPoolInit)
AFD_CPU_INTRINSIC(AscendCTBufPoolResetCheck)
AFD_CPU_INTRINSIC(AscendCUpdateTbufPoolStatus)
AFD_CPU_INTRINSIC(__ib_set_stub)
AFD_CPU_INTRINSIC(__ib_wait_stub)
AFD_CPU_INTRINSIC(__sync_all_stub)
AFD_CPU_INTRINSIC(bcnt0)
AFD_CPU_INTRINSIC(bcnt1)
AFD_CPU_INTRINSIC(clz)
AFD_CPU_INTRINSIC(conv_f322f16o)
AFD_CPU_INTRINSIC(conv_f322s32a)
AFD_CPU_INTRINSIC(conv_f322s32c)
AFD_CPU_INTRINSIC(conv_f322s32f)
AFD_CPU_INTRINSIC(conv_f322s32r)
AFD_CPU_INTRINSIC(copy_cbuf_to_bt)
AFD_CPU_INTRINSIC(copy_cbuf_to_fbuf)
AFD_CPU_INTRINSIC(copy_cbuf_to_gm)
AFD_CPU_INTRINSIC(copy_gm_to_cbuf)
AFD_CPU_INTRINSIC(copy_gm_to_cbuf_multi_nd2nz_b16)
AFD_CPU_INTRINSIC(copy_gm_to_cbuf_multi_nd2nz_b32s)
AFD_CPU_INTRINSIC(copy_gm_to_cbuf_multi_nd2nz_b8)
AFD_CPU_INTRINSIC(copy_gm_to_ubuf)
AFD_CPU_INTRINSIC(copy_gm_to_ubuf_align_b16)
AFD_CPU_INTRINSIC(copy_gm_to_ubuf_align_b32)
AFD_CPU_INTRINSIC(copy_gm_to_ubuf_align_b8)
AFD_CPU_INTRINSIC(copy_ubuf_to_gm)
AFD_CPU_INTRINSIC(copy_ubuf_to_gm_align_b16)
AFD_CPU_INTRINSIC(copy_ubuf_to_gm_align_b32)
AFD_CPU_INTRINSIC(copy_ubuf_to_gm_align_b8)
AFD_CPU_INTRINSIC(copy_ubuf_to_ubuf)
AFD_CPU_INTRINSIC(create_cbuf_matrix)
AFD_CPU_INTRINSIC(dc_preload)
AFD_CPU_INTRINSIC(dcci)
AFD_CPU_INTRINSIC(dsb)
AFD_CPU_INTRINSIC(ffts_cross_core_sync)
AFD_CPU_INTRINSIC(get_acc_val)
AFD_CPU_INTRINSIC(get_arch_ver)
AFD_CPU_INTRINSIC(get_block_idx)
AFD_CPU_INTRINSIC(get_block_num)
AFD_CPU_INTRINSIC(get_ctrl)
AFD_CPU_INTRINSIC(get_icache_prl_st)
AFD_CPU_INTRINSIC(get_max_min_cnt)
AFD_CPU_INTRINSIC(get_pc)
AFD_CPU_INTRINSIC(get_rsvd_cnt)
AFD_CPU_INTRINSIC(get_st_atomic_cfg)
AFD_CPU_INTRINSIC(get_vms4_sr)
AFD_CPU_INTRINSIC(hset_flag)
AFD_CPU_INTRINSIC(hwait_flag)
AFD_CPU_INTRINSIC(img2colv2_cbuf_to_ca)
AFD_CPU_INTRINSIC(img2colv2_cbuf_to_ca_s4)
AFD_CPU_INTRINSIC(img2colv2_cbuf_to_cb)
AFD_CPU_INTRINSIC(ld_dev)
AFD_CPU_INTRINSIC(load_cbuf_to_ca)
AFD_CPU_INTRINSIC(load_cbuf_to_ca_s4)
AFD_CPU_INTRINSIC(load_cbuf_to_cb)
AFD_CPU_INTRINSIC(load_cbuf_to_cb_s4)
AFD_CPU_INTRINSIC(load_cbuf_to_cb_sp)
AFD_CPU_INTRINSIC(load_cbuf_to_cb_transpose_s4)
AFD_CPU_INTRINSIC(mad_sp)
AFD_CPU_INTRINSIC(pipe_barrier)
AFD_CPU_INTRINSIC(preload)
AFD_CPU_INTRINSIC(sbitset0)
AFD_CPU_INTRINSIC(sbitset1)
AFD_CPU_INTRINSIC(scatter_vnchwconv_b16)
AFD_CPU_INTRINSIC(scatter_vnchwconv_b32)
AFD_CPU_INTRINSIC(scatter_vnchwconv_b8)
AFD_CPU_INTRINSIC(set_aipp_spr_0)
AFD_CPU_INTRINSIC(set_aipp_spr_1)
AFD_CPU_INTRINSIC(set_aipp_spr_18)
AFD_CPU_INTRINSIC(set_aipp_spr_19)
AFD_CPU_INTRINSIC(set_aipp_spr_2)
AFD_CPU_INTRINSIC(set_aipp_spr_20)
AFD_CPU_INTRINSIC(set_aipp_spr_21)
AFD_CPU_INTRINSIC(set_aipp_spr_3)
AFD_CPU_INTRINSIC(set_aipp_spr_4)
AFD_CPU_INTRINSIC(set_aipp_spr_5)
AFD_CPU_INTRINSIC(set_aipp_spr_6)
AFD_CPU_INTRINSIC(set_aipp_spr_7)
AFD_CPU_INTRINSIC(set_aipp_spr_8)
AFD_CPU_INTRINSIC(set_aipp_spr_9)
AFD_CPU_INTRINSIC(set_atomic_add)
AFD_CPU_INTRINSIC(set_atomic_bf16)
AFD_CPU_INTRINSIC(set_atomic_f16)
AFD_CPU_INTRINSIC(set_atomic_f32)
AFD_CPU_INTRINSIC(set_atomic_max)
AFD_CPU_INTRINSIC(set_atomic_min)
AFD_CPU_INTRINSIC(set_atomic_none)
AFD_CPU_INTRINSIC(set_atomic_s16)
AFD_CPU_INTRINSIC(set_atomic_s32)
AFD_CPU_INTRINSIC(set_atomic_s8)
AFD_CPU_INTRINSIC(set_cmpmask)
AFD_CPU_INTRINSIC(set_ctrl)
AFD_CPU_INTRINSIC(set_data_exp_0)
AFD_CPU_INTRINSIC(set_data_exp_1)
AFD_CPU_INTRINSIC(set_data_exp_2)
AFD_CPU_INTRINSIC(set_data_exp_3)
AFD_CPU_INTRINSIC(set_deqscale)
AFD_CPU_INTRINSIC(set_ffts_base_addr)
AFD_CPU_INTRINSIC(set_flag)
AFD_CPU_INTRINSIC(set_fmatrix)
AFD_CPU_INTRINSIC(set_fmatrix_b)
AFD_CPU_INTRINSIC(set_fpc)
AFD_CPU_INTRINSIC(set_l1_3d_size)
AFD_CPU_INTRINSIC(set_l3d_rpt)
AFD_CPU_INTRINSIC(set_mask_count)
AFD_CPU_INTRINSIC(set_mask_norm)
AFD_CPU_INTRINSIC(set_mov_pad_val)
AFD_CPU_INTRINSIC(set_nd_para)
AFD_CPU_INTRINSIC(set_padding)
AFD_CPU_INTRINSIC(set_quant_pre)
AFD_CPU_INTRINSIC(set_st_atomic_cfg)
AFD_CPU_INTRINSIC(set_va_reg_sb)
AFD_CPU_INTRINSIC(set_vector_mask)
AFD_CPU_INTRINSIC(sff0)
AFD_CPU_INTRINSIC(sff1)
AFD_CPU_INTRINSIC(sflbits)
AFD_CPU_INTRINSIC(st_dev)
AFD_CPU_INTRINSIC(trap)
AFD_CPU_INTRINSIC(vabs)
AFD_CPU_INTRINSIC(vadd)
AFD_CPU_INTRINSIC(vadds)
AFD_CPU_INTRINSIC(vand)
AFD_CPU_INTRINSIC(vbrcb)
AFD_CPU_INTRINSIC(vcadd)
AFD_CPU_INTRINSIC(vcgadd)
AFD_CPU_INTRINSIC(vcgmax)
AFD_CPU_INTRINSIC(vcmax)
AFD_CPU_INTRINSIC(vcmpv_eq)
AFD_CPU_INTRINSIC(vcmpv_ge)
AFD_CPU_INTRINSIC(vcmpv_gt)
AFD_CPU_INTRINSIC(vcmpv_le)
AFD_CPU_INTRINSIC(vcmpv_lt)
AFD_CPU_INTRINSIC(vcmpv_ne)
AFD_CPU_INTRINSIC(vcmpvs_eq)
AFD_CPU_INTRINSIC(vcmpvs_ge)
AFD_CPU_INTRINSIC(vcmpvs_gt)
AFD_CPU_INTRINSIC(vcmpvs_le)
AFD_CPU_INTRINSIC(vcmpvs_lt)
AFD_CPU_INTRINSIC(vcmpvs_ne)
AFD_CPU_INTRINSIC(vconv_bf162f32)
AFD_CPU_INTRINSIC(vconv_bf162s32a)
AFD_CPU_INTRINSIC(vconv_bf162s32c)
AFD_CPU_INTRINSIC(vconv_bf162s32f)
AFD_CPU_INTRINSIC(vconv_bf162s32r)
AFD_CPU_INTRINSIC(vconv_bf162s32z)
AFD_CPU_INTRINSIC(vconv_deq)
AFD_CPU_INTRINSIC(vconv_f162f32)
AFD_CPU_INTRINSIC(vconv_f162s16a)
AFD_CPU_INTRINSIC(vconv_f162s16c)
AFD_CPU_INTRINSIC(vconv_f162s16f)
AFD_CPU_INTRINSIC(vconv_f162s16r)
AFD_CPU_INTRINSIC(vconv_f162s16z)
AFD_CPU_INTRINSIC(vconv_f162s32a)
AFD_CPU_INTRINSIC(vconv_f162s32c)
AFD_CPU_INTRINSIC(vconv_f162s32f)
AFD_CPU_INTRINSIC(vconv_f162s32r)
AFD_CPU_INTRINSIC(vconv_f162s32z)
AFD_CPU_INTRINSIC(vconv_f162s4)
AFD_CPU_INTRINSIC(vconv_f162s4a)
AFD_CPU_INTRINSIC(vconv_f162s4c)
AFD_CPU_INTRINSIC(vconv_f162s4f)
AFD_CPU_INTRINSIC(vconv_f162s4r)
AFD_CPU_INTRINSIC(vconv_f162s4z)
AFD_CPU_INTRINSIC(vconv_f162s8)
AFD_CPU_INTRINSIC(vconv_f162s8a)
AFD_CPU_INTRINSIC(vconv_f162s8c)
AFD_CPU_INTRINSIC(vconv_f162s8f)
AFD_CPU_INTRINSIC(vconv_f162s8r)
AFD_CPU_INTRINSIC(vconv_f162s8z)
AFD_CPU_INTRINSIC(vconv_f162u8)
AFD_CPU_INTRINSIC(vconv_f162u8a)
AFD_CPU_INTRINSIC(vconv_f162u8c)
AFD_CPU_INTRINSIC(vconv_f162u8f)
AFD_CPU_INTRINSIC(vconv_f162u8r)
AFD_CPU_INTRINSIC(vconv_f162u8z)
AFD_CPU_INTRINSIC(vconv_f322bf16a)
AFD_CPU_INTRINSIC(vconv_f322bf16c)
AFD_CPU_INTRINSIC(vconv_f322bf16f)
AFD_CPU_INTRINSIC(vconv_f322bf16r)
AFD_CPU_INTRINSIC(vconv_f322bf16z)
AFD_CPU_INTRINSIC(vconv_f322f16)
AFD_CPU_INTRINSIC(vconv_f322f16a)
AFD_CPU_INTRINSIC(vconv_f322f16c)
AFD_CPU_INTRINSIC(vconv_f322f16f)
AFD_CPU_INTRINSIC(vconv_f322f16o)
AFD_CPU_INTRINSIC(vconv_f322f16r)
AFD_CPU_INTRINSIC(vconv_f322f16z)
AFD_CPU_INTRINSIC(vconv_f322f32a)
AFD_CPU_INTRINSIC(vconv_f322f32c)
AFD_CPU_INTRINSIC(vconv_f322f32f)
AFD_CPU_INTRINSIC(vconv_f322f32r)
AFD_CPU_INTRINSIC(vconv_f322f32z)
AFD_CPU_INTRINSIC(vconv_f322s16a)
AFD_CPU_INTRINSIC(vconv_f322s16c)
AFD_CPU_INTRINSIC(vconv_f322s16f)
AFD_CPU_INTRINSIC(vconv_f322s16r)
AFD_CPU_INTRINSIC(vconv_f322s16z)
AFD_CPU_INTRINSIC(vconv_f322s32a)
AFD_CPU_INTRINSIC(vconv_f322s32c)
AFD_CPU_INTRINSIC(vconv_f322s32f)
AFD_CPU_INTRINSIC(vconv_f322s32r)
AFD_CPU_INTRINSIC(vconv_f322s32z)
AFD_CPU_INTRINSIC(vconv_f322s64a)
AFD_CPU_INTRINSIC(vconv_f322s64c)
AFD_CPU_INTRINSIC(vconv_f322s64f)
AFD_CPU_INTRINSIC(vconv_f322s64r)
AFD_CPU_INTRINSIC(vconv_f322s64z)
AFD_CPU_INTRINSIC(vconv_s162f16)
AFD_CPU_INTRINSIC(vconv_s162f16a)
AFD_CPU_INTRINSIC(vconv_s162f16c)
AFD_CPU_INTRINSIC(vconv_s162f16f)
AFD_CPU_INTRINSIC(vconv_s162f16r)
AFD_CPU_INTRINSIC(vconv_s162f16z)
AFD_CPU_INTRINSIC(vconv_s162f32)
AFD_CPU_INTRINSIC(vconv_s322f32)
AFD_CPU_INTRINSIC(vconv_s322f32a)
AFD_CPU_INTRINSIC(vconv_s322f32c)
AFD_CPU_INTRINSIC(vconv_s322f32f)
AFD_CPU_INTRINSIC(vconv_s322f32r)
AFD_CPU_INTRINSIC(vconv_s322f32z)
AFD_CPU_INTRINSIC(vconv_s322s16)
AFD_CPU_INTRINSIC(vconv_s322s64)
AFD_CPU_INTRINSIC(vconv_s42f16)
AFD_CPU_INTRINSIC(vconv_s642f32a)
AFD_CPU_INTRINSIC(vconv_s642f32c)
AFD_CPU_INTRINSIC(vconv_s642f32f)
AFD_CPU_INTRINSIC(vconv_s642f32r)
AFD_CPU_INTRINSIC(vconv_s642f32z)
AFD_CPU_INTRINSIC(vconv_s642s32)
AFD_CPU_INTRINSIC(vconv_s82f16)
AFD_CPU_INTRINSIC(vconv_u82f16)
AFD_CPU_INTRINSIC(vcopy)
AFD_CPU_INTRINSIC(vdiv)
AFD_CPU_INTRINSIC(vector_dup)
AFD_CPU_INTRINSIC(vexp)
AFD_CPU_INTRINSIC(vgather)
AFD_CPU_INTRINSIC(vld_va_reg)
AFD_CPU_INTRINSIC(vln)
AFD_CPU_INTRINSIC(vmax)
AFD_CPU_INTRINSIC(vmaxs)
AFD_CPU_INTRINSIC(vmin)
AFD_CPU_INTRINSIC(vmins)
AFD_CPU_INTRINSIC(vmul)
AFD_CPU_INTRINSIC(vmulconv_f162s8)
AFD_CPU_INTRINSIC(vmulconv_f162u8)
AFD_CPU_INTRINSIC(vmuls)
AFD_CPU_INTRINSIC(vnot)
AFD_CPU_INTRINSIC(vor)
AFD_CPU_INTRINSIC(vrec)
AFD_CPU_INTRINSIC(vreducev2)
AFD_CPU_INTRINSIC(vsel)
AFD_CPU_INTRINSIC(vshr)
AFD_CPU_INTRINSIC(vsqrt)
AFD_CPU_INTRINSIC(vsub)
AFD_CPU_INTRINSIC(vtranspose)
AFD_CPU_INTRINSIC(wait_flag)
AFD_CPU_INTRINSIC(wait_flag_dev)
