// SPDX-License-Identifier: Apache-2.0
// Written for this project (afd-ascend-ops): the torch binding of the compiled Ascend kernels,
// built as the extension module afd_ascend_ops._C.
//
//   * Registers the PrivateUse1 (NPU) kernels of afd_ascend::a2e and afd_ascend::e2a, and no
//     schema: afd_ascend_ops/ops.py defines the schemas (afd_ascend_ops/schemas.py), so this
//     module may load before or after it.
//   * Each kernel checks its arguments as the CPU reference does, allocates the outputs with the
//     shapes of afd_ascend_ops/fake.py (common/afd_shapes.h), calls aclnnA2e / aclnnE2a through
//     op-plugin's EXEC_NPU_CMD (which finds the function by name with dlsym in the custom op
//     package's libcust_opapi.so: no generated aclnn_*.h is included), then reads the kernel's
//     status word and turns a failure into a TORCH_CHECK error naming both sides' values.
//     Reading the status waits for the kernel: every call synchronises its stream.
//   * group_ep is the HCCL communicator name the NPU op provider got from its ProcessGroupHCCL
//     (getHcclCommName). The torch-npu 2.13.0 headers offer no name -> handle lookup
//     (HcclGetCommName goes the other way; ProcessGroupHCCL::getHcclComm needs the process group
//     object), so the name is handed to aclnn as the ops' MC2 group attribute, and the CANN op
//     framework binds the communicator and its windows to the launch.
//   * Python functions of the module, for the NPU op provider: open_group (collective, before
//     any exchange on the group; it refuses an NPU the kernels are not built for, afd_socs.h),
//     interrupt, close_group (group_registry.h says what they keep).
//
// Written for this project and never compiled into a module or run: no CANN toolkit or Ascend
// device was available. Only its syntax was checked, against torch's and the torch-npu wheel's
// headers (tools/check_binding_syntax.py).
#include <string>
#include <vector>

#include <torch/extension.h>
#include <torch/library.h>

#include "op_plugin/utils/op_api_common.h"

#include "afd_mailbox.h"
#include "afd_protocol.h"
#include "afd_shapes.h"
#include "afd_socs.h"
#include "afd_tiling.h"
#include "group_registry.h"
#include "status_message.h"

namespace afd {
namespace binding {
namespace {

bool IsWireDtype(at::ScalarType type)
{
    return type == at::kBFloat16 || type == at::kHalf || type == at::kFloat;
}

std::vector<int64_t> Sizes(const Dims& dims)
{
    return dims.rank == 1 ? std::vector<int64_t>{dims.d0} : std::vector<int64_t>{dims.d0, dims.d1};
}

at::Tensor Empty(const Dims& dims, const at::TensorOptions& options)
{
    return at::empty(Sizes(dims), options);
}

at::Tensor Zeros(const Dims& dims, const at::TensorOptions& options)
{
    return at::zeros(Sizes(dims), options);
}

std::string Where(const char* op, const Group& group)
{
    return std::string("afd_ascend::") + op + " on group '" + group.name + "': ";
}

// Takes the group's call lock; refuses a group that failed, was interrupted, or whose world
// differs from the call's (ValueError, as the reference's _check_world).
std::unique_lock<std::mutex> Enter(Group& group, const char* op, int64_t ffnRanks,
                                   int64_t attentionRanks, int64_t rank)
{
    std::unique_lock<std::mutex> lock(group.calls);
    TORCH_CHECK(!group.interrupted, "[AFDShutdown] ", Where(op, group),
                "the op provider was interrupted or closed");
    TORCH_CHECK(group.fault.empty(), group.fault,
                " (this group failed earlier; close its op provider and start again)");
    const World& world = group.world;
    TORCH_CHECK_VALUE(ffnRanks == static_cast<int64_t>(world.ffnRanks) &&
                          attentionRanks == static_cast<int64_t>(world.attentionRanks) &&
                          rank == static_cast<int64_t>(world.rank),
                      Where(op, group), "expert_rank_size=", ffnRanks,
                      ", attention_rank_size=", attentionRanks, ", rank=", rank,
                      ", but the group was opened for ", world.ffnRanks, " FFN ranks, ",
                      world.attentionRanks, " attention ranks and world rank ", world.rank,
                      "; pass the world's facts (FFN ranks first)");
    return lock;
}

// Raises an AFD error found on the host, after failing the group with it (as one the kernel
// reports fails it).
void Refuse(Group& group, const std::string& message)
{
    group.fault = message;
    TORCH_CHECK(false, message);
}

// The kernels read every tensor argument from device memory.
void CheckOnNpu(const char* op, const Group& group, const char* name, const at::Tensor& t)
{
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, Where(op, group), name,
                      " must be an NPU tensor, not one on ", t.device());
}

void CheckRowTensor(const char* op, const Group& group, const char* name, const at::Tensor& t)
{
    bool onNpu = t.device().type() == c10::DeviceType::PrivateUse1;
    TORCH_CHECK_VALUE(IsWireDtype(t.scalar_type()) && onNpu,
                      Where(op, group), "the NPU kernel moves NPU tensors of bfloat16, float16 or "
                      "float32; ", name, " is ", t.scalar_type(), " on ", t.device());
}

void CheckPositive(const char* op, const char* name, int64_t value)
{
    TORCH_CHECK_VALUE(value > 0, "afd_ascend::", op, ": ", name, " must be positive, not ", value);
}

// Waits for the kernel (the copy to the host does), and raises the status's error, if any,
// after failing the group with it. `counts`: a2e's atten_batch_size output (or undefined).
void CheckStatus(Group& group, const char* op, const at::Tensor& status, const at::Tensor& counts)
{
    at::Tensor words = status.to(at::kCPU);
    const int64_t* w = words.data_ptr<int64_t>();
    if (w[0] == kStatusOk) {
        return;
    }
    std::vector<int64_t> hostCounts;
    if (counts.defined()) {
        at::Tensor c = counts.to(at::kCPU).to(at::kLong);
        hostCounts.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }
    CallSite site{op, group.name, group.world, group.timeoutS};
    Refuse(group, StatusMessage(site, w, hostCounts));
}

struct A2eLaunch {
    at::Tensor x;
    c10::optional<at::Tensor> expertIds;
    c10::optional<at::Tensor> scales;
    int64_t batchSize;
    int64_t hiddenSize;
    int64_t topk;
    int64_t aivNum;
    int64_t computeGate;
    int64_t mode;  // afd::Mode
};

struct A2eOutputs {
    at::Tensor expandX;
    at::Tensor expertIds;
    at::Tensor scales;
    at::Tensor counts;
    at::Tensor status;
};

// aclnnA2e's parameters: inputs, attributes in the op definition's order (a2e_def.cpp,
// common/op_host/afd_def_host.h), outputs. EXEC_NPU_CMD takes lvalues only, and declares
// locals named aic_num and aiv_num while logging: no argument may bear those names.
void LaunchA2e(Group& group, A2eLaunch& in, A2eOutputs& out)
{
    at::Tensor state = group.state;
    int64_t ffnRanks = group.world.ffnRanks;
    int64_t attentionRanks = group.world.attentionRanks;
    int64_t rank = group.world.rank;
    char* groupEp = group.name.data();
    int64_t timeoutMs = group.TimeoutMs();
    int64_t stopAddr = group.stop->DeviceAddress();
    EXEC_NPU_CMD(aclnnA2e, in.x, in.expertIds, in.scales, state, in.batchSize, in.hiddenSize,
                 in.topk, ffnRanks, attentionRanks, rank, groupEp, in.aivNum, in.computeGate,
                 in.mode, timeoutMs, stopAddr, out.expandX, out.expertIds, out.scales, out.counts,
                 out.status);
}

// Attention a2e with compute_gate: the routing of the rows must be int32 / float32 [n, topk].
void CheckRouting(const Group& group, const c10::optional<at::Tensor>& tensor, const char* name,
                  at::ScalarType type, int64_t rows, int64_t topk)
{
    bool ok = tensor.has_value() && tensor->scalar_type() == type && tensor->dim() == 2 &&
              tensor->size(0) == rows && tensor->size(1) == topk;
    TORCH_CHECK_VALUE(ok, Where("a2e", group), "with compute_gate=1, ", name, " must be ", type,
                      " [", rows, ", ", topk, "], not ",
                      tensor.has_value() ? c10::str(tensor->scalar_type(), " ", tensor->sizes())
                                         : std::string("None"));
    CheckOnNpu("a2e", group, name, *tensor);
}

c10::optional<at::Tensor> Contiguous(const c10::optional<at::Tensor>& tensor)
{
    return tensor.has_value() ? c10::optional<at::Tensor>(tensor->contiguous()) : c10::nullopt;
}

}  // namespace

std::vector<at::Tensor> A2e(const at::Tensor& x, const c10::optional<at::Tensor>& expert_ids,
                            const c10::optional<at::Tensor>& scales, int64_t batch_size,
                            int64_t hidden_size, int64_t topk, int64_t expert_rank_size,
                            int64_t attention_rank_size, int64_t rank, c10::string_view group_ep,
                            int64_t aiv_num, int64_t compute_gate)
{
    std::shared_ptr<Group> group = Registry::Get().Lookup(std::string(group_ep));
    auto lock = Enter(*group, "a2e", expert_rank_size, attention_rank_size, rank);
    const World& world = group->world;
    CheckRowTensor("a2e", *group, "x", x);
    CheckPositive("a2e", "hidden_size", hidden_size);
    bool gated = compute_gate != 0;
    if (gated) {
        CheckPositive("a2e", "topk (with compute_gate=1)", topk);
    }
    A2eLaunch in{x.contiguous(), Contiguous(expert_ids), Contiguous(scales), batch_size,
                 hidden_size, topk, group->AivNum(aiv_num), compute_gate, kModeExchange};
    if (world.IsFfn()) {
        TORCH_CHECK_VALUE(!expert_ids.has_value() ||
                              (expert_ids->scalar_type() == at::kInt &&
                               expert_ids->numel() == static_cast<int64_t>(world.PeerCount())),
                          Where("a2e", *group), "on an FFN rank, expert_ids gives the rows "
                          "expected from each of its ", world.PeerCount(), " block members "
                          "(int32, -1: takes no part), not ",
                          expert_ids.has_value() ? c10::str(expert_ids->scalar_type(), " ",
                                                            expert_ids->sizes())
                                                 : std::string());
        if (expert_ids.has_value()) {
            CheckOnNpu("a2e", *group, "expert_ids", *expert_ids);
        }
        TORCH_CHECK_VALUE(batch_size >= 0, Where("a2e", *group), "batch_size must be >= 0, not ",
                          batch_size);
        in.scales = c10::nullopt;  // unused on an FFN rank
    } else {
        TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == hidden_size, Where("a2e", *group),
                          "x must be [rows, hidden_size=", hidden_size, "], not ", x.sizes());
        if (gated) {
            CheckRouting(*group, expert_ids, "expert_ids", at::kInt, x.size(0), topk);
            CheckRouting(*group, scales, "scales", at::kFloat, x.size(0), topk);
        } else {
            in.expertIds = c10::nullopt;
            in.scales = c10::nullopt;
        }
        if (group->pendingRows != -1) {
            Refuse(*group, "[AFDProtocolError] " + Where("a2e", *group) +
                               DescribeRank(world, world.rank) +
                               " sends again before e2a received the result of its previous a2e "
                               "on this group; call a2e and e2a in pairs, one pair per layer and "
                               "stage");
        }
        in.batchSize = x.size(0);  // the attention side's count (batch_size is ignored there)
    }

    A2eShapes shapes = A2eOutputShapes(world, in.batchSize, hidden_size, topk, gated);
    at::TensorOptions rows = x.options();
    bool placeholders = !world.IsFfn();
    A2eOutputs out{
        placeholders ? Zeros(shapes.expandX, rows) : Empty(shapes.expandX, rows),
        placeholders || !gated ? Zeros(shapes.expertIds, rows.dtype(at::kInt))
                               : Empty(shapes.expertIds, rows.dtype(at::kInt)),
        placeholders || !gated ? Zeros(shapes.scales, rows.dtype(at::kFloat))
                               : Empty(shapes.scales, rows.dtype(at::kFloat)),
        Empty(shapes.attenBatchSize, rows.dtype(at::kInt)),
        Zeros(StatusShape(), rows.dtype(at::kLong)),
    };
    LaunchA2e(*group, in, out);
    CheckStatus(*group, "a2e", out.status, out.counts);
    if (!world.IsFfn()) {
        group->pendingRows = x.size(0);
    }
    // Every row an FFN rank receives is real (all True); the attention side's is a placeholder.
    at::Tensor mask = world.IsFfn() ? at::ones(Sizes(shapes.xActiveMask), rows.dtype(at::kBool))
                                    : at::zeros(Sizes(shapes.xActiveMask), rows.dtype(at::kBool));
    return {out.expandX, out.expertIds, out.scales, out.counts, mask};
}

at::Tensor E2a(const at::Tensor& expand_x, const at::Tensor& atten_batch_size, int64_t batch_size,
               int64_t hidden_size, int64_t topk, int64_t expert_rank_size,
               int64_t attention_rank_size, int64_t rank, c10::string_view group_ep,
               int64_t aiv_num)
{
    std::shared_ptr<Group> group = Registry::Get().Lookup(std::string(group_ep));
    auto lock = Enter(*group, "e2a", expert_rank_size, attention_rank_size, rank);
    const World& world = group->world;
    CheckRowTensor("e2a", *group, "expand_x", expand_x);
    CheckPositive("e2a", "hidden_size", hidden_size);
    std::string me = DescribeRank(world, world.rank);
    if (world.IsFfn()) {
        TORCH_CHECK_VALUE(expand_x.dim() == 2 && expand_x.size(1) == hidden_size,
                          Where("e2a", *group), "expand_x must be [rows, hidden_size=",
                          hidden_size, "], not ", expand_x.sizes());
        TORCH_CHECK_VALUE(batch_size >= 0, Where("e2a", *group), "batch_size must be >= 0, not ",
                          batch_size);
        CheckOnNpu("e2a", *group, "atten_batch_size", atten_batch_size);
        if (atten_batch_size.scalar_type() != at::kInt ||
            atten_batch_size.numel() != static_cast<int64_t>(world.Slots())) {
            Refuse(*group, "[AFDProtocolError] " + Where("e2a", *group) + "atten_batch_size " +
                               c10::str(atten_batch_size.scalar_type(), " ",
                                        atten_batch_size.sizes()) +
                               " is not what a2e returned on " + me + " (" +
                               std::to_string(world.Slots()) + " int32 counts); pass output [3] "
                               "of the matching a2e");
        }
    } else {
        if (group->pendingRows == -1) {
            Refuse(*group, "[AFDProtocolError] " + Where("e2a", *group) + me +
                               " asks for a result but sent nothing with a2e on this group; call "
                               "a2e and e2a in pairs");
        }
        if (expand_x.dim() < 1 || expand_x.size(0) != group->pendingRows) {
            Refuse(*group, "[AFDProtocolError] " + Where("e2a", *group) + "expand_x is " +
                               c10::str(expand_x.sizes()) + ", but the matching a2e sent " +
                               std::to_string(group->pendingRows) + " rows; pass a tensor with as "
                               "many rows as that a2e's x");
        }
    }

    at::Tensor input = expand_x.contiguous();
    at::Tensor counts = atten_batch_size.contiguous();
    Dims shape = E2aOutputShape(world, expand_x.size(0), hidden_size);
    at::Tensor y =
        world.IsFfn() ? Zeros(shape, expand_x.options()) : Empty(shape, expand_x.options());
    at::Tensor status = Zeros(StatusShape(), expand_x.options().dtype(at::kLong));

    // aclnnE2a's parameters: inputs, attributes in the op definition's order (e2a_def.cpp),
    // outputs; lvalues only, none named aic_num or aiv_num (see LaunchA2e).
    at::Tensor state = group->state;
    int64_t batchSize = world.IsFfn() ? batch_size : expand_x.size(0);  // ignored on attention
    int64_t ffnRanks = world.ffnRanks;
    int64_t attentionRanks = world.attentionRanks;
    int64_t worldRank = world.rank;
    char* groupEp = group->name.data();
    int64_t aivNum = group->AivNum(aiv_num);
    int64_t timeoutMs = group->TimeoutMs();
    int64_t stopAddr = group->stop->DeviceAddress();
    EXEC_NPU_CMD(aclnnE2a, input, counts, state, batchSize, hidden_size, topk, ffnRanks,
                 attentionRanks, worldRank, groupEp, aivNum, timeoutMs, stopAddr, y, status);
    CheckStatus(*group, "e2a", status, at::Tensor());
    if (!world.IsFfn()) {
        group->pendingRows = -1;
    }
    return y;
}

namespace {

// The vector cores of the current device (ACL_DEV_ATTR_VECTOR_CORE_NUM).
int64_t DeviceVectorCores()
{
    int32_t device = 0;
    int64_t cores = 0;
    aclError error = aclrtGetDevice(&device);
    if (error == ACL_SUCCESS) {
        error = aclrtGetDeviceInfo(static_cast<uint32_t>(device), ACL_DEV_ATTR_VECTOR_CORE_NUM,
                                   &cores);
    }
    TORCH_CHECK(error == ACL_SUCCESS && cores > 0, "afd_ascend: cannot read the vector core "
                "count of the current NPU (ACL error ", error, "); check the CANN and driver "
                "versions");
    return cores;
}

}  // namespace

// Collective over the group's world: registers `group_ep` for a2e/e2a in this process and zeroes
// this rank's mailbox control words (a2e in reset mode). Every rank calls it, then the caller
// runs a barrier (not on the HCCL group: see afd_mailbox.h) before any rank's first a2e or e2a
// on it. Refuses an NPU the kernels are not built for (afd_socs.h). `stages`: how many groups
// the caller opens for stages that may run at once; with more than one, each call is limited
// to the device's vector cores / stages (group_registry.h, core cap).
void OpenGroup(const std::string& group_ep, const at::Tensor& anchor, int64_t expert_rank_size,
               int64_t attention_rank_size, int64_t rank, double timeout_s, int64_t stages)
{
    const char* soc = aclrtGetSocName();
    TORCH_CHECK(SocTargetOfDevice(soc) != nullptr, "[AFDInstallError] afd_ascend: this NPU is ",
                soc == nullptr ? "of an unknown SoC" : soc, "; ", kNoKernelReason);
    TORCH_CHECK_VALUE(anchor.device().type() == c10::DeviceType::PrivateUse1,
                      "afd_ascend: open_group needs an NPU anchor tensor (it picks the device), "
                      "not one on ", anchor.device());
    TORCH_CHECK_VALUE(stages >= 1, "afd_ascend: stages must be >= 1, not ", stages);
    TORCH_CHECK_VALUE(expert_rank_size >= 1 && attention_rank_size >= expert_rank_size,
                      "afd_ascend: expert_rank_size (", expert_rank_size, ") must be >= 1 and "
                      "attention_rank_size (", attention_rank_size, ") >= it: a2e/e2a pair ranks "
                      "in blocks");
    TORCH_CHECK_VALUE(rank >= 0 && rank < expert_rank_size + attention_rank_size,
                      "afd_ascend: rank ", rank, " is outside the world of ",
                      expert_rank_size + attention_rank_size, " ranks");
    TORCH_CHECK_VALUE(timeout_s > 0, "afd_ascend: timeout_s must be positive, not ", timeout_s);
    World world{static_cast<uint32_t>(expert_rank_size), static_cast<uint32_t>(attention_rank_size),
                static_cast<uint32_t>(rank)};
    TORCH_CHECK_VALUE(world.Slots() <= kMaxPeers, "afd_ascend: an FFN rank would serve ",
                      world.Slots(), " attention ranks; the kernels serve at most ", kMaxPeers);
    int64_t coreCap = 0;
    if (stages > 1) {
        int64_t cores = DeviceVectorCores();
        TORCH_CHECK_VALUE(cores >= stages, "afd_ascend: ", stages, " stages cannot each have "
                          "vector cores of their own on an NPU with ", cores, "; use fewer stages");
        coreCap = cores / stages;
    }

    auto group = std::make_shared<Group>();
    group->name = group_ep;
    group->world = world;
    group->timeoutS = timeout_s;
    group->coreCap = coreCap;
    group->state = at::zeros(Sizes(StateShape(world)), anchor.options().dtype(at::kLong));
    Registry::Get().Add(group);

    std::unique_lock<std::mutex> lock(group->calls);
    at::TensorOptions options = anchor.options().dtype(at::kBFloat16);
    A2eLaunch in{at::empty({0, 1}, options), c10::nullopt, c10::nullopt, 0, 1, 0, 0, 0,
                 kModeReset};
    A2eOutputs out{at::zeros({1, 1}, options), at::zeros({1, 1}, options.dtype(at::kInt)),
                   at::zeros({1, 1}, options.dtype(at::kFloat)),
                   at::zeros(Sizes(Dims1(world.Slots())), options.dtype(at::kInt)),
                   Zeros(StatusShape(), options.dtype(at::kLong))};
    try {
        LaunchA2e(*group, in, out);
        CheckStatus(*group, "a2e", out.status, at::Tensor());
    } catch (const std::exception& error) {
        // The mailbox may not be reset: no exchange may run on this group.
        group->fault = std::string("[AFDError] afd_ascend: open_group('") + group_ep +
                       "') failed: " + error.what();
        throw;
    }
}

}  // namespace binding
}  // namespace afd

TORCH_LIBRARY_IMPL(afd_ascend, PrivateUse1, m)
{
    m.impl("a2e", TORCH_FN(afd::binding::A2e));
    m.impl("e2a", TORCH_FN(afd::binding::E2a));
}

PYBIND11_MODULE(_C, m)
{
    m.doc() = "afd-ascend-ops' compiled Ascend kernels: the PrivateUse1 kernels of "
              "afd_ascend::a2e/e2a (registered on import) and their group life cycle";
    m.def("open_group", &afd::binding::OpenGroup, pybind11::arg("group_ep"),
          pybind11::arg("anchor"), pybind11::arg("expert_rank_size"),
          pybind11::arg("attention_rank_size"), pybind11::arg("rank"), pybind11::arg("timeout_s"),
          pybind11::arg("stages"),
          "Collective: register group_ep (an HCCL communicator name over the FFN-first world) "
          "for a2e/e2a and zero this rank's mailbox; then a barrier of every rank, not on the "
          "HCCL group. Refuses an NPU the kernels are not built for. stages: the groups opened "
          "for stages that may run at once (each call then gets at most cores / stages).");
    m.def(
        "interrupt",
        [](const std::string& group_ep) { afd::binding::Registry::Get().Interrupt(group_ep); },
        pybind11::arg("group_ep"),
        "End a blocked a2e/e2a on group_ep (AFDShutdown) and refuse later calls. Any thread.");
    m.def(
        "close_group",
        [](const std::string& group_ep) { afd::binding::Registry::Get().Close(group_ep); },
        pybind11::arg("group_ep"), "Interrupt and forget group_ep; later calls raise AFDShutdown.");
}
