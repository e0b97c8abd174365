// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the AscendC op definition of A2e (kernel a2e,
// host entry aclnnA2e). Parameters in the order of a2e_tiling.h's enums; the attributes as
// common/op_host/afd_def_host.h lays them out. Rows move as bytes, so every row dtype shares one
// kernel. Needs the CANN host headers; never built here (syntax-checked only, csrc/README.md).
//
//   inputs   x [rows, H] (attention: its rows; FFN: a [0, H] anchor giving the dtype)
//            expert_ids (optional) int32: attention, gated: [rows, topk] routing;
//                                         FFN: [block size] rows expected per member or -1
//            scales (optional) float32 [rows, topk]: attention, gated
//            state int64 [3 * ceil(A/F)]: the group's sequence state, updated in place
//   outputs  expand_x, expand_expert_ids, expand_scales, atten_batch_size (afd_shapes.h),
//            status int64 [24] (afd_protocol.h)
#include "register/op_def_registry.h"

#include "afd_def_host.h"
#include "a2e_shape.h"
#include "a2e_tiling.h"

namespace ops {

class A2e : public OpDef {
public:
    explicit A2e(const char* name) : OpDef(name)
    {
        const std::vector<ge::DataType> rowTypes = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
        const std::vector<ge::Format> nd = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
        auto all = [](ge::DataType type) { return std::vector<ge::DataType>{type, type, type}; };

        Input("x").ParamType(REQUIRED).DataType(rowTypes).Format(nd).UnknownShapeFormat(nd);
        Input("expert_ids").ParamType(OPTIONAL).DataType(all(ge::DT_INT32)).Format(nd)
            .UnknownShapeFormat(nd);
        Input("scales").ParamType(OPTIONAL).DataType(all(ge::DT_FLOAT)).Format(nd)
            .UnknownShapeFormat(nd);
        Input("state").ParamType(REQUIRED).DataType(all(ge::DT_INT64)).Format(nd)
            .UnknownShapeFormat(nd);

        Output("expand_x").ParamType(REQUIRED).DataType(rowTypes).Format(nd).UnknownShapeFormat(nd);
        Output("expand_expert_ids").ParamType(REQUIRED).DataType(all(ge::DT_INT32)).Format(nd)
            .UnknownShapeFormat(nd);
        Output("expand_scales").ParamType(REQUIRED).DataType(all(ge::DT_FLOAT)).Format(nd)
            .UnknownShapeFormat(nd);
        Output("atten_batch_size").ParamType(REQUIRED).DataType(all(ge::DT_INT32)).Format(nd)
            .UnknownShapeFormat(nd);
        Output("status").ParamType(REQUIRED).DataType(all(ge::DT_INT64)).Format(nd)
            .UnknownShapeFormat(nd);

        afd::host::AddWorldAttrs(*this);
        Attr("compute_gate").AttrType(REQUIRED).Int();
        Attr("mode").AttrType(REQUIRED).Int();  // afd::Mode: exchange, or reset the mailbox
        afd::host::AddControlAttrs(*this);

        SetInferShape(ge::InferShapeA2e).SetInferDataType(ge::InferDataTypeA2e);
        AICore().SetTiling(optiling::TilingA2e);
        afd::host::AddKernelConfig(*this);
    }
};

OP_ADD(A2e);

}  // namespace ops
