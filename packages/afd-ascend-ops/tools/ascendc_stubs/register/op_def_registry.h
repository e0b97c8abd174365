// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's register/op_def_registry.h
// (metadef) holding only what csrc/'s op_host files call: the op definition builder (ops::OpDef),
// the graph types (ge::DataType, ge::Format, ge::graphStatus) and the runtime contexts of shape
// inference and tiling (gert::*), for CI's syntax check (tools/check_kernel_syntax.py). Each
// declaration has the signature metadef gives it (csrc/README.md has the commit); the ones that
// matter are pinned by tools/api_probes/host_api_probe.cpp, compiled against these stubs and
// against the real headers. Bodies are empty: nothing here runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fe {
class PlatFormInfos;
}  // namespace fe

namespace ge {

using graphStatus = uint32_t;
const graphStatus GRAPH_FAILED = 0xFFFFFFFF;
const graphStatus GRAPH_SUCCESS = 0;

enum DataType { DT_FLOAT = 0, DT_FLOAT16 = 1, DT_INT32 = 3, DT_INT64 = 9, DT_BF16 = 27 };
enum Format { FORMAT_NCHW = 0, FORMAT_NHWC, FORMAT_ND };

}  // namespace ge

namespace gert {

class Shape {
public:
    void SetDimNum(const size_t dim_num) {}
    int64_t GetDim(const size_t idx) const { return 0; }
    void SetDim(size_t idx, const int64_t dim_value) {}
};

class StorageShape {
public:
    const Shape& GetStorageShape() const { return shape_; }

private:
    Shape shape_;
};

class CompileTimeTensorDesc {
public:
    ge::DataType GetDataType() const { return ge::DT_FLOAT; }
};

class RuntimeAttrs {
public:
    template <typename T>
    const T* GetAttrPointer(size_t index) const { return nullptr; }
};

class TilingData {
public:
    void SetDataSize(const size_t size) {}
};

class ExtendedKernelContext {
public:
    const CompileTimeTensorDesc* GetInputDesc(const size_t index) const { return nullptr; }
    const RuntimeAttrs* GetAttrs() const { return nullptr; }
    const char* GetNodeName() const { return nullptr; }
};

class TilingContext : public ExtendedKernelContext {
public:
    const StorageShape* GetInputShape(const size_t index) const { return nullptr; }
    const StorageShape* GetOptionalInputShape(const size_t ir_index) const { return nullptr; }
    ge::graphStatus SetTilingKey(const uint64_t tiling_key) { return ge::GRAPH_SUCCESS; }
    ge::graphStatus SetScheduleMode(const uint32_t schedule_mode) { return ge::GRAPH_SUCCESS; }
    ge::graphStatus SetBlockDim(const uint32_t block_dim) { return ge::GRAPH_SUCCESS; }
    template <typename T>
    auto GetTilingData() -> T* { return nullptr; }
    TilingData* GetRawTilingData() { return nullptr; }
    size_t* GetWorkspaceSizes(const size_t workspace_count) { return nullptr; }
    fe::PlatFormInfos* GetPlatformInfo() const { return nullptr; }
};

class InferShapeContext : public ExtendedKernelContext {
public:
    const Shape* GetInputShape(const size_t index) const { return nullptr; }
    Shape* GetOutputShape(const size_t index) { return nullptr; }
};

class InferDataTypeContext : public ExtendedKernelContext {
public:
    ge::DataType GetInputDataType(const size_t index) const { return ge::DT_FLOAT; }
    ge::graphStatus SetOutputDataType(const size_t index, const ge::DataType datatype)
    {
        return ge::GRAPH_SUCCESS;
    }
};

struct OpImplRegisterV2 {
    using InferShapeKernelFunc = uint32_t (*)(InferShapeContext*);
    using TilingKernelFunc = uint32_t (*)(TilingContext*);
    using InferDataTypeKernelFunc = uint32_t (*)(InferDataTypeContext*);
};

}  // namespace gert

namespace ops {

enum Option { IGNORE = 0, OPTIONAL = 1, REQUIRED = 2, DYNAMIC = 3, VIRTUAL = 4 };

class OpParamDef {
public:
    OpParamDef& ParamType(Option param_type) { return *this; }
    OpParamDef& DataType(std::vector<ge::DataType> types) { return *this; }
    OpParamDef& Format(std::vector<ge::Format> formats) { return *this; }
    OpParamDef& UnknownShapeFormat(std::vector<ge::Format> formats) { return *this; }
};

class OpAttrDef {
public:
    OpAttrDef& AttrType(Option attr_type) { return *this; }
    OpAttrDef& Int(void) { return *this; }
    OpAttrDef& Int(int64_t value) { return *this; }
    OpAttrDef& String(void) { return *this; }
    OpAttrDef& String(const char* value) { return *this; }
};

class OpAICoreDef {
public:
    OpAICoreDef& SetTiling(gert::OpImplRegisterV2::TilingKernelFunc func) { return *this; }
    OpAICoreDef& AddConfig(const char* soc) { return *this; }
};

class OpMC2Def {
public:
    OpMC2Def& HcclGroup(const char* value) { return *this; }
    OpMC2Def& HcclGroup(std::vector<const char*> value) { return *this; }
};

class OpDef {
public:
    explicit OpDef(const char* type) {}
    OpParamDef& Input(const char* name) { return param_; }
    OpParamDef& Output(const char* name) { return param_; }
    OpAttrDef& Attr(const char* name) { return attr_; }
    OpDef& SetInferShape(gert::OpImplRegisterV2::InferShapeKernelFunc func) { return *this; }
    OpDef& SetInferDataType(gert::OpImplRegisterV2::InferDataTypeKernelFunc func) { return *this; }
    OpAICoreDef& AICore(void) { return aicore_; }
    OpMC2Def& MC2(void) { return mc2_; }

private:
    OpParamDef param_;
    OpAttrDef attr_;
    OpAICoreDef aicore_;
    OpMC2Def mc2_;
};

}  // namespace ops

// Registers the op definition class opType (one object of it is made when the library loads).
#define OP_ADD(opType, ...) static opType g_##opType##_added(#opType)
