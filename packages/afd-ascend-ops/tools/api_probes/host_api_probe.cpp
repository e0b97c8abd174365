// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the host-side CANN API that csrc/'s op_host files
// call, pinned, as kernel_api_probe.cpp pins the kernel side: compiled against the committed
// stubs (CI) and against the real CANN headers (the real-header check); every assertion must
// hold for both.
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "register/op_def_registry.h"
#include "tiling/hccl/hccl_tiling.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"

namespace afd_probe {

// Mc2CcTilingConfig takes the op type as a uint32_t; a scoped enum (as AscendC::HcclCMDType is)
// does not convert to it.
enum class ScopedOpType : uint32_t { kAllToAllV = 8 };
using AscendC::Mc2CcTilingConfig;
static_assert(std::is_constructible_v<Mc2CcTilingConfig, const std::string&, uint32_t, const std::string&,
                                      uint32_t, uint8_t, uint8_t, uint8_t>,
              "Mc2CcTilingConfig(groupName, uint32_t opType, algConfig, reduceType, dst, src, engine)");
static_assert(std::is_constructible_v<Mc2CcTilingConfig, const char*, uint32_t, const char*>,
              "Mc2CcTilingConfig(const char*, uint32_t, const char*) as the tiling calls it");
static_assert(!std::is_constructible_v<Mc2CcTilingConfig, const char*, ScopedOpType, const char*>,
              "an enum-class op type is rejected");
static_assert(
    std::is_same_v<decltype(static_cast<uint32_t (Mc2CcTilingConfig::*)(::Mc2InitTiling&)>(
                       &Mc2CcTilingConfig::GetTiling)),
                   uint32_t (Mc2CcTilingConfig::*)(::Mc2InitTiling&)> &&
        std::is_same_v<decltype(static_cast<uint32_t (Mc2CcTilingConfig::*)(::Mc2CcTiling&)>(
                           &Mc2CcTilingConfig::GetTiling)),
                       uint32_t (Mc2CcTilingConfig::*)(::Mc2CcTiling&)>,
    "Mc2CcTilingConfig::GetTiling(::Mc2InitTiling&) and (::Mc2CcTiling&) -> uint32_t");

// The platform queries.
using platform_ascendc::PlatformAscendC;
static_assert(std::is_constructible_v<PlatformAscendC, fe::PlatFormInfos*> &&
                  !std::is_default_constructible_v<PlatformAscendC>,
              "PlatformAscendC(fe::PlatFormInfos*)");
static_assert(std::is_same_v<decltype(&PlatformAscendC::GetCoreNumAiv), uint32_t (PlatformAscendC::*)() const> &&
                  std::is_same_v<decltype(&PlatformAscendC::GetLibApiWorkSpaceSize),
                                 uint32_t (PlatformAscendC::*)() const>,
              "GetCoreNumAiv(), GetLibApiWorkSpaceSize() -> uint32_t");

// Graph types.
static_assert(std::is_same_v<ge::graphStatus, uint32_t> && ge::GRAPH_SUCCESS == 0, "graphStatus");
static_assert(ge::DT_FLOAT == 0 && ge::DT_FLOAT16 == 1 && ge::DT_INT32 == 3 && ge::DT_INT64 == 9 &&
                  ge::DT_BF16 == 27 && ge::FORMAT_ND == 2,
              "the DataType and Format codes");

// The op definition builder.
using ops::OpAICoreDef;
using ops::OpAttrDef;
using ops::OpDef;
using ops::OpMC2Def;
using ops::OpParamDef;
static_assert(ops::REQUIRED == 2 && ops::OPTIONAL == 1, "ops::Option");
static_assert(std::is_constructible_v<OpDef, const char*> && !std::is_convertible_v<const char*, OpDef>,
              "explicit OpDef(const char*)");
static_assert(std::is_same_v<decltype(&OpDef::Input), OpParamDef& (OpDef::*)(const char*)> &&
                  std::is_same_v<decltype(&OpDef::Output), OpParamDef& (OpDef::*)(const char*)> &&
                  std::is_same_v<decltype(&OpDef::Attr), OpAttrDef& (OpDef::*)(const char*)>,
              "OpDef::Input/Output/Attr(const char*)");
static_assert(std::is_same_v<decltype(&OpParamDef::ParamType), OpParamDef& (OpParamDef::*)(ops::Option)> &&
                  std::is_same_v<decltype(&OpParamDef::DataType),
                                 OpParamDef& (OpParamDef::*)(std::vector<ge::DataType>)> &&
                  std::is_same_v<decltype(&OpParamDef::Format),
                                 OpParamDef& (OpParamDef::*)(std::vector<ge::Format>)> &&
                  std::is_same_v<decltype(&OpParamDef::UnknownShapeFormat),
                                 OpParamDef& (OpParamDef::*)(std::vector<ge::Format>)>,
              "OpParamDef::ParamType/DataType/Format/UnknownShapeFormat");
static_assert(std::is_same_v<decltype(&OpAttrDef::AttrType), OpAttrDef& (OpAttrDef::*)(ops::Option)> &&
                  std::is_same_v<decltype(static_cast<OpAttrDef& (OpAttrDef::*)()>(&OpAttrDef::Int)),
                                 OpAttrDef& (OpAttrDef::*)()> &&
                  std::is_same_v<decltype(static_cast<OpAttrDef& (OpAttrDef::*)()>(&OpAttrDef::String)),
                                 OpAttrDef& (OpAttrDef::*)()>,
              "OpAttrDef::AttrType(Option), Int(), String()");
static_assert(std::is_same_v<decltype(&OpDef::SetInferShape),
                             OpDef& (OpDef::*)(gert::OpImplRegisterV2::InferShapeKernelFunc)> &&
                  std::is_same_v<decltype(&OpDef::SetInferDataType),
                                 OpDef& (OpDef::*)(gert::OpImplRegisterV2::InferDataTypeKernelFunc)>,
              "OpDef::SetInferShape/SetInferDataType");
static_assert(std::is_same_v<gert::OpImplRegisterV2::TilingKernelFunc, uint32_t (*)(gert::TilingContext*)> &&
                  std::is_same_v<gert::OpImplRegisterV2::InferShapeKernelFunc,
                                 uint32_t (*)(gert::InferShapeContext*)> &&
                  std::is_same_v<gert::OpImplRegisterV2::InferDataTypeKernelFunc,
                                 uint32_t (*)(gert::InferDataTypeContext*)>,
              "the kernel function types");
static_assert(std::is_same_v<decltype(&OpDef::AICore), OpAICoreDef& (OpDef::*)()> &&
                  std::is_same_v<decltype(&OpAICoreDef::SetTiling),
                                 OpAICoreDef& (OpAICoreDef::*)(gert::OpImplRegisterV2::TilingKernelFunc)> &&
                  std::is_same_v<decltype(static_cast<OpAICoreDef& (OpAICoreDef::*)(const char*)>(
                                     &OpAICoreDef::AddConfig)),
                                 OpAICoreDef& (OpAICoreDef::*)(const char*)>,
              "OpDef::AICore(), OpAICoreDef::SetTiling, AddConfig(const char*)");
static_assert(std::is_same_v<decltype(&OpDef::MC2), OpMC2Def& (OpDef::*)()> &&
                  std::is_same_v<decltype(static_cast<OpMC2Def& (OpMC2Def::*)(const char*)>(
                                     &OpMC2Def::HcclGroup)),
                                 OpMC2Def& (OpMC2Def::*)(const char*)>,
              "OpDef::MC2(), OpMC2Def::HcclGroup(const char*)");

// The runtime contexts, as the tiling and the shape inference call them.
template <typename T>
T& Ref();
using gert::InferDataTypeContext;
using gert::InferShapeContext;
using gert::TilingContext;
static_assert(std::is_same_v<decltype(Ref<const TilingContext>().GetAttrs()), const gert::RuntimeAttrs*> &&
                  std::is_same_v<decltype(Ref<const InferShapeContext>().GetAttrs()), const gert::RuntimeAttrs*>,
              "GetAttrs() -> const RuntimeAttrs*");
static_assert(std::is_same_v<decltype(Ref<const gert::RuntimeAttrs>().GetAttrPointer<int64_t>(size_t{0})),
                             const int64_t*> &&
                  std::is_same_v<decltype(Ref<const gert::RuntimeAttrs>().GetAttrPointer<char>(size_t{0})),
                                 const char*>,
              "RuntimeAttrs::GetAttrPointer<T>(size_t) -> const T*");
static_assert(std::is_same_v<decltype(Ref<const TilingContext>().GetInputShape(size_t{0})),
                             const gert::StorageShape*> &&
                  std::is_same_v<decltype(Ref<const TilingContext>().GetOptionalInputShape(size_t{0})),
                                 const gert::StorageShape*> &&
                  std::is_same_v<decltype(Ref<const gert::StorageShape>().GetStorageShape()), const gert::Shape&>,
              "TilingContext::GetInputShape/GetOptionalInputShape -> const StorageShape*");
static_assert(std::is_same_v<decltype(Ref<const TilingContext>().GetInputDesc(size_t{0})),
                             const gert::CompileTimeTensorDesc*> &&
                  std::is_same_v<decltype(Ref<const gert::CompileTimeTensorDesc>().GetDataType()), ge::DataType>,
              "GetInputDesc(size_t)->GetDataType()");
static_assert(std::is_same_v<decltype(Ref<const TilingContext>().GetPlatformInfo()), fe::PlatFormInfos*> &&
                  std::is_same_v<decltype(Ref<TilingContext>().GetTilingData<int>()), int*> &&
                  std::is_same_v<decltype(Ref<TilingContext>().GetRawTilingData()), gert::TilingData*> &&
                  std::is_same_v<decltype(Ref<TilingContext>().GetWorkspaceSizes(size_t{1})), size_t*>,
              "TilingContext: platform info, tiling data, workspace sizes");
static_assert(std::is_same_v<decltype(Ref<TilingContext>().SetBlockDim(uint32_t{1})), ge::graphStatus> &&
                  std::is_same_v<decltype(Ref<TilingContext>().SetScheduleMode(uint32_t{1})), ge::graphStatus> &&
                  std::is_same_v<decltype(Ref<TilingContext>().SetTilingKey(uint64_t{0})), ge::graphStatus>,
              "TilingContext::SetBlockDim/SetScheduleMode/SetTilingKey");
static_assert(std::is_same_v<decltype(Ref<InferShapeContext>().GetOutputShape(size_t{0})), gert::Shape*> &&
                  std::is_same_v<decltype(Ref<const InferShapeContext>().GetInputShape(size_t{0})),
                                 const gert::Shape*>,
              "InferShapeContext::GetOutputShape/GetInputShape");
static_assert(std::is_same_v<decltype(Ref<const InferDataTypeContext>().GetInputDataType(size_t{0})),
                             ge::DataType> &&
                  std::is_same_v<decltype(Ref<InferDataTypeContext>().SetOutputDataType(size_t{0}, ge::DT_BF16)),
                                 ge::graphStatus>,
              "InferDataTypeContext::GetInputDataType/SetOutputDataType");

}  // namespace afd_probe
