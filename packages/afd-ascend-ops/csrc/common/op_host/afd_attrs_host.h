// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): reading an op's attributes by index, in the
// tiling and the shape inference alike (both contexts expose GetAttrs()). Header only.
// Needs the CANN host headers; never built here (syntax-checked only, csrc/README.md).
#pragma once

#include "register/op_def_registry.h"

namespace afd {
namespace host {

template <typename Context>
inline int64_t IntAttr(const Context* context, size_t index)
{
    const int64_t* value = context->GetAttrs()->template GetAttrPointer<int64_t>(index);
    return value == nullptr ? 0 : *value;
}

template <typename Context>
inline const char* StringAttr(const Context* context, size_t index)
{
    return context->GetAttrs()->template GetAttrPointer<char>(index);
}

}  // namespace host
}  // namespace afd
