// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): a stand-in for CANN's lib/hccl/hccl_common.h (see
// kernel_operator.h here for what these stubs are and how they are kept true). HcclCMDType is an
// enum class, as in CANN: it does not convert to the uint32_t op type Mc2CcTilingConfig takes.
#pragma once

#include <cstdint>

namespace AscendC {

constexpr uint32_t HCCL_GROUP_ID_0 = 0;

enum class HcclCMDType {
    HCCL_CMD_INVALID = 0,
    HCCL_CMD_BROADCAST = 1,
    HCCL_CMD_ALLREDUCE,
    HCCL_CMD_REDUCE,
    HCCL_CMD_SEND,
    HCCL_CMD_RECEIVE,
    HCCL_CMD_ALLGATHER,
    HCCL_CMD_REDUCE_SCATTER,
    HCCL_CMD_ALLTOALLV,
    HCCL_CMD_ALLTOALLVC,
    HCCL_CMD_ALLTOALL,
    HCCL_CMD_GATHER,
    HCCL_CMD_SCATTER,
    HCCL_CMD_BATCH_SEND_RECV,
    HCCL_CMD_BATCH_PUT,
    HCCL_CMD_BATCH_GET,
    HCCL_CMD_ALLGATHER_V,
    HCCL_CMD_REDUCE_SCATTER_V,
    HCCL_CMD_BATCH_WRITE,
    HCCL_CMD_HALF_ALLTOALLV = 20,
    HCCL_CMD_ALL
};

enum HcclServerType { HCCL_SERVER_TYPE_AICPU = 0, HCCL_SERVER_TYPE_CCU = 5, HCCL_SERVER_TYPE_END };

enum class CoreType : uint8_t { DEFAULT, ON_AIV, ON_AIC };

struct HcclServerConfig {
    CoreType type;
    int64_t blockId;
};

}  // namespace AscendC
