// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the tiling both ops share. Each op's tiling
// function reads its own attributes into ExchangeArgs and calls FillTiling, which checks them,
// fills afd::OpTilingData (our arguments, the spin limit, the window size, the HCCL tilings of
// group_ep), and sets the launch: block dim, batch schedule mode, workspace.
//
// Header only: the msopgen op_host build compiles every .cpp in an op's op_host directory, and
// build_kernels.sh copies the shared headers flat into it. Needs the CANN host headers; never
// built into a package here (no CANN toolkit); its syntax is checked against the public CANN
// headers (csrc/README.md).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "register/op_def_registry.h"
#include "tiling/hccl/hccl_tiling.h"
#include "tiling/platform/platform_ascendc.h"
#include "tiling/tiling_api.h"

#include "afd_build_target.h"
#include "afd_mailbox.h"
#include "afd_op_tiling.h"
#include "afd_protocol.h"

namespace afd {
namespace host {

// An op's attributes and input facts, read by its tiling function.
struct ExchangeArgs {
    const char* op;         // "a2e" / "e2a", for messages
    int64_t batchSize;
    int64_t hiddenSize;
    int64_t topk;
    int64_t ffnRanks;
    int64_t attentionRanks;
    int64_t rank;
    const char* groupEp;    // the HCCL communicator name (the MC2 group attribute)
    int64_t aivNum;         // 0: every vector core of the SoC
    int64_t computeGate;    // a2e only (0 for e2a)
    int64_t timeoutMs;
    int64_t stopAddr;
    int64_t mode;           // afd::Mode
    int64_t rows;           // rows of the row input
    ge::DataType dtype;     // of the row input
    bool hasExpected;       // FFN a2e: expert_ids given
};

inline ge::graphStatus Reject(gert::TilingContext* context, const ExchangeArgs& args,
                              const char* why)
{
    std::fprintf(stderr, "afd_ascend::%s tiling (%s): %s\n", args.op, context->GetNodeName(), why);
    return ge::GRAPH_FAILED;
}

// The wire dtype code and element size of a row dtype; false for a dtype the ops do not move.
inline bool WireDtype(ge::DataType dtype, uint32_t* code, uint32_t* bytes)
{
    switch (dtype) {
        case ge::DT_BF16: *code = kDtypeBfloat16; *bytes = 2; return true;
        case ge::DT_FLOAT16: *code = kDtypeFloat16; *bytes = 2; return true;
        case ge::DT_FLOAT: *code = kDtypeFloat32; *bytes = 4; return true;
        default: return false;
    }
}

// The HCCL window size: HCCL_BUFFSIZE (MiB, HCCL's default 200), which must be equal on every
// rank of the world (the mailbox layout is computed from it on both sides; the NPU op provider
// compares it across ranks when it opens, and the kernel checks it against the window the
// communicator really has, HcclOpResParam::winSize).
inline uint64_t WindowBytes()
{
    const char* env = std::getenv("HCCL_BUFFSIZE");
    uint64_t mib = (env != nullptr && *env != '\0') ? std::strtoull(env, nullptr, 10) : 200;
    return mib * 1024ull * 1024ull;
}

inline uint64_t SpinLimit(int64_t timeoutMs)
{
    uint64_t rounds = static_cast<uint64_t>(timeoutMs) * 1000000ull / kEstimatedPollNs;
    return rounds == 0 ? 1 : rounds;
}

inline ge::graphStatus FillTiling(gert::TilingContext* context, const ExchangeArgs& args)
{
    if (args.ffnRanks < 1 || args.attentionRanks < args.ffnRanks) {
        return Reject(context, args, "expert_rank_size must be >= 1 and attention_rank_size >= it");
    }
    if (args.rank < 0 || args.rank >= args.ffnRanks + args.attentionRanks) {
        return Reject(context, args, "rank is outside the world (FFN ranks first)");
    }
    if (args.hiddenSize <= 0 || args.batchSize < 0 || args.rows < 0 || args.timeoutMs <= 0) {
        return Reject(context, args, "hidden_size and the timeout must be positive, counts >= 0");
    }
    if (args.computeGate != 0 && args.topk <= 0) {
        return Reject(context, args, "topk must be positive with compute_gate=1");
    }
    if (args.groupEp == nullptr || args.groupEp[0] == '\0') {
        return Reject(context, args, "group_ep names no HCCL communicator");
    }
    World world{static_cast<uint32_t>(args.ffnRanks), static_cast<uint32_t>(args.attentionRanks),
                static_cast<uint32_t>(args.rank)};
    if (world.Slots() > kMaxPeers) {
        return Reject(context, args, "an FFN rank would serve more than kMaxPeers attention ranks");
    }
    Window window{WindowBytes(), world.Slots()};
    if (window.SlotBytes() == 0) {
        return Reject(context, args, "the HCCL window (HCCL_BUFFSIZE) cannot hold the mailboxes");
    }
    uint32_t dtype = 0;
    uint32_t elementBytes = 0;
    if (!WireDtype(args.dtype, &dtype, &elementBytes)) {
        return Reject(context, args, "the rows must be bfloat16, float16 or float32");
    }

    auto ascendc = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
    uint32_t available = ascendc.GetCoreNumAiv();
    uint32_t cores = (args.aivNum > 0 && static_cast<uint32_t>(args.aivNum) < available)
                         ? static_cast<uint32_t>(args.aivNum)
                         : available;

    OpTilingData* data = context->GetTilingData<OpTilingData>();
    ExchangeTiling& t = data->exchange;
    t.ffnRanks = world.ffnRanks;
    t.attentionRanks = world.attentionRanks;
    t.rank = world.rank;
    t.mode = static_cast<uint32_t>(args.mode);
    t.batchSize = static_cast<uint32_t>(args.batchSize);
    t.rows = static_cast<uint32_t>(args.rows);
    t.hiddenSize = static_cast<uint32_t>(args.hiddenSize);
    t.rowBytes = static_cast<uint32_t>(args.hiddenSize) * elementBytes;
    t.dtype = dtype;
    t.topk = static_cast<uint32_t>(args.topk);
    t.gated = args.computeGate != 0 ? 1 : 0;
    t.hasExpected = args.hasExpected ? 1 : 0;
    t.spinLimit = SpinLimit(args.timeoutMs);
    t.stopAddr = static_cast<uint64_t>(args.stopAddr);
    t.windowBytes = window.windowBytes;

    // The HCCL context of group_ep: the kernel uses only its windows (no HCCL collective runs),
    // but the MC2 framework binds the communicator through these tilings, with the op type
    // (a uint32_t, the value of AscendC::HcclCMDType) and algorithm of the SoC built for.
    AscendC::Mc2CcTilingConfig hccl(args.groupEp, kBuildTarget.hcclOpType,
                                    kBuildTarget.hcclAlgConfig);
    hccl.GetTiling(data->mc2InitTiling);
    hccl.GetTiling(data->mc2CcTiling);

    context->GetRawTilingData()->SetDataSize(sizeof(OpTilingData));
    context->SetBlockDim(cores);
    context->SetScheduleMode(1);  // batch mode: every core starts together (SyncAll needs it)
    context->SetTilingKey(0);     // one kernel for every dtype: rows move as bytes
    size_t* workspace = context->GetWorkspaceSizes(1);
    workspace[0] = ascendc.GetLibApiWorkSpaceSize() + kPlanBytes;
    return ge::GRAPH_SUCCESS;
}

}  // namespace host
}  // namespace afd
