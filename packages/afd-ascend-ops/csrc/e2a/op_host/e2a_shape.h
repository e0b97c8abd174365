// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): e2a's shape and dtype inference.
// Needs the CANN host headers; syntax-checked only.
#pragma once

#include "register/op_def_registry.h"

namespace ge {

// FFN: [1, 1]; attention: [rows of expand_x, H] (common/afd_shapes.h); status [24].
ge::graphStatus InferShapeE2a(gert::InferShapeContext* context);
// y: expand_x's dtype; status int64.
ge::graphStatus InferDataTypeE2a(gert::InferDataTypeContext* context);

}  // namespace ge
