// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the AscendC op definition of E2a (kernel e2a,
// host entry aclnnE2a). Parameters in the order of e2a_tiling.h's enums; the attributes as
// common/op_host/afd_def_host.h lays them out. Rows move as bytes, so every row dtype shares one
// kernel. Needs the CANN host headers; never built here (syntax-checked only, csrc/README.md).
//
//   inputs   expand_x [rows, H] (FFN: its results in block order; attention: the rows it sent,
//            whose count is the result's)
//            atten_batch_size int32 [ceil(A/F)]: output [3] of the matching a2e
//            state int64 [3 * ceil(A/F)]: the group's sequence state, updated in place
//   outputs  y (afd_shapes.h), status int64 [24] (afd_protocol.h)
#include "register/op_def_registry.h"

#include "afd_def_host.h"
#include "e2a_shape.h"
#include "e2a_tiling.h"

namespace ops {

class E2a : public OpDef {
public:
    explicit E2a(const char* name) : OpDef(name)
    {
        const std::vector<ge::DataType> rowTypes = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
        const std::vector<ge::Format> nd = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};
        auto all = [](ge::DataType type) { return std::vector<ge::DataType>{type, type, type}; };

        Input("expand_x").ParamType(REQUIRED).DataType(rowTypes).Format(nd).UnknownShapeFormat(nd);
        Input("atten_batch_size").ParamType(REQUIRED).DataType(all(ge::DT_INT32)).Format(nd)
            .UnknownShapeFormat(nd);
        Input("state").ParamType(REQUIRED).DataType(all(ge::DT_INT64)).Format(nd)
            .UnknownShapeFormat(nd);

        Output("y").ParamType(REQUIRED).DataType(rowTypes).Format(nd).UnknownShapeFormat(nd);
        Output("status").ParamType(REQUIRED).DataType(all(ge::DT_INT64)).Format(nd)
            .UnknownShapeFormat(nd);

        afd::host::AddWorldAttrs(*this);
        afd::host::AddControlAttrs(*this);

        SetInferShape(ge::InferShapeE2a).SetInferDataType(ge::InferDataTypeE2a);
        AICore().SetTiling(optiling::TilingE2a);
        afd::host::AddKernelConfig(*this);
    }
};

OP_ADD(E2a);

}  // namespace ops
