// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the parts of the a2e and e2a op definitions they
// share. The order in which attributes are added is the order of the generated aclnnA2e /
// aclnnE2a parameters (inputs, attributes, outputs), so the binding passes its arguments in it:
//
//   AddWorldAttrs    batch_size, hidden_size, topk, expert_rank_size, attention_rank_size,
//                    rank, group_ep, aiv_num          (the schema's order)
//   <the op's own>   a2e: compute_gate, mode
//   AddControlAttrs  timeout_ms, stop_addr            (ours: the binding fills them)
//
// Header only, like afd_tiling_host.h. Needs the CANN host headers; its syntax is checked
// against the public CANN headers (csrc/README.md).
#pragma once

#include "register/op_def_registry.h"

#include "afd_build_target.h"

namespace afd {
namespace host {

inline void AddWorldAttrs(ops::OpDef& def)
{
    def.Attr("batch_size").AttrType(ops::REQUIRED).Int();
    def.Attr("hidden_size").AttrType(ops::REQUIRED).Int();
    def.Attr("topk").AttrType(ops::REQUIRED).Int();
    def.Attr("expert_rank_size").AttrType(ops::REQUIRED).Int();
    def.Attr("attention_rank_size").AttrType(ops::REQUIRED).Int();
    def.Attr("rank").AttrType(ops::REQUIRED).Int();
    def.Attr("group_ep").AttrType(ops::REQUIRED).String();
    def.Attr("aiv_num").AttrType(ops::REQUIRED).Int();
}

inline void AddControlAttrs(ops::OpDef& def)
{
    def.Attr("timeout_ms").AttrType(ops::REQUIRED).Int();  // every wait of a call, together
    def.Attr("stop_addr").AttrType(ops::REQUIRED).Int();   // the host-mapped stop word
}

// A vector-core kernel on the SoC this package is built for, bound to the HCCL communicator
// named by the group_ep attribute (MC2: the kernel gets that communicator's context and windows).
inline void AddKernelConfig(ops::OpDef& def)
{
    def.AICore().AddConfig(kBuildTarget.buildName);
    def.MC2().HcclGroup("group_ep");
}

}  // namespace host
}  // namespace afd
