// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a2e's shape and dtype inference.
// Needs the CANN host headers; syntax-checked only.
#pragma once

#include "register/op_def_registry.h"

namespace ge {

// The shapes of common/afd_shapes.h (afd_ascend_ops/fake.py) for this rank's role.
ge::graphStatus InferShapeA2e(gert::InferShapeContext* context);
// expand_x: x's dtype; expert ids int32; scales float32; atten_batch_size int32; status int64.
ge::graphStatus InferDataTypeA2e(gert::InferDataTypeContext* context);

}  // namespace ge
