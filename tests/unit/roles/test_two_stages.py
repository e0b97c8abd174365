"""TwoStageForward: the attention runner's two stages on real stage threads, with vLLM's
forward-context global and torch's per-thread modes (the model forwards are stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.forward_context import get_forward_context, is_forward_context_available  # noqa: E402

from afd_attention.two_stages import TwoStageForward  # noqa: E402
from afd_core.config.stages import StagePolicy, StageSlice  # noqa: E402
from afd_core.errors import AFDProtocolError  # noqa: E402

POLICY = StagePolicy(decode_token_threshold=4, prefill_token_threshold=8)


@pytest.fixture
def stages():
    forward = TwoStageForward(POLICY, timeout_s=10)
    yield forward
    forward.close()


def test_a_batch_of_decodes_splits_from_the_decode_threshold_and_others_from_the_prefill_one(
    stages: TwoStageForward,
) -> None:
    assert stages.plan([1, 1, 1, 1]) == (StageSlice(0, 2, 0, 2), StageSlice(2, 4, 2, 4))
    assert len(stages.plan([1, 1, 1])) == 1
    assert len(stages.plan([3, 1, 1, 1])) == 1  # a prefill: 6 tokens < 8
    assert stages.plan([5, 1, 1, 1]) == (StageSlice(0, 1, 0, 5), StageSlice(1, 4, 5, 8))


def test_each_stage_runs_in_its_own_forward_context_in_inference_mode_taking_turns(
    stages: TwoStageForward,
) -> None:
    contexts = [object(), object()]
    seen: list[tuple[int, object, bool]] = []

    def stage(s: int):
        def forward() -> torch.Tensor:
            for _ in range(2):  # two layers: hand over after each send
                seen.append((s, get_forward_context(), torch.is_inference_mode_enabled()))
                stages.checkpoint()
            return torch.full((s + 1,), float(s))

        return forward

    outputs = stages.run(contexts, [stage(0), stage(1)])
    assert [o.tolist() for o in outputs] == [[0.0], [1.0, 1.0]]
    assert [s for s, _, _ in seen] == [0, 1, 0, 1]
    assert all(ctx is contexts[s] and inference for s, ctx, inference in seen)
    assert not is_forward_context_available()  # the caller's (none) is back


def test_a_failing_stage_ends_the_step_with_its_error_and_the_next_step_runs(
    stages: TwoStageForward,
) -> None:
    def fine() -> str:
        stages.checkpoint()
        stages.checkpoint()
        return "fine"

    def failing() -> str:
        stages.checkpoint()
        raise AFDProtocolError("AFD: stage 1 broke at layer 1")

    with pytest.raises(AFDProtocolError, match="stage 1 broke at layer 1"):
        stages.run([object(), object()], [fine, failing])
    assert not is_forward_context_available()
    assert stages.run([object(), object()], [lambda: 0, lambda: 1]) == [0, 1]


class FakeMetadataRunner:
    """vLLM 0.32's ``_build_attention_metadata`` (its signature), recording its slices."""

    def __init__(self) -> None:
        self.input_batch = SimpleNamespace(req_ids=["a", "b", "c", "d"])

    def _build_attention_metadata(self, num_tokens, num_reqs, max_query_len,
                                  num_tokens_padded=None, num_reqs_padded=None,
                                  ubatch_slices=None, logits_indices=None,
                                  max_num_sampled_tokens=None, use_spec_decode=False,
                                  for_cudagraph_capture=False, num_scheduled_tokens=None,
                                  slot_mappings=None):  # fmt: skip
        return ubatch_slices, None


def test_the_fake_has_vllms_signature() -> None:
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    ours = inspect.signature(FakeMetadataRunner._build_attention_metadata).parameters
    assert list(ours) == list(
        inspect.signature(GPUModelRunner._build_attention_metadata).parameters
    )


def test_a_scheduled_batch_that_splits_gets_one_attention_metadata_per_stage(
    stages: TwoStageForward,
) -> None:
    from afd_attention.runner import AttentionRunnerMixin

    class Runner(AttentionRunnerMixin, FakeMetadataRunner):
        pass

    runner = Runner()
    runner.afd_stages = stages
    scheduled = {"a": 1, "b": 1, "c": 1, "d": 1}
    slices, _ = runner._build_attention_metadata(
        num_tokens=4, num_reqs=4, max_query_len=1, num_scheduled_tokens=scheduled
    )
    assert [(s.request_slice, s.token_slice) for s in slices] == [
        (slice(0, 2), slice(0, 2)),
        (slice(2, 4), slice(2, 4)),
    ]
    assert runner._afd_stage_plan == (StageSlice(0, 2, 0, 2), StageSlice(2, 4, 2, 4))
    # A dummy run (no scheduled requests) and a batch below the threshold run one stage.
    assert runner._build_attention_metadata(num_tokens=4, num_reqs=4, max_query_len=1)[0] is None
    assert runner._afd_stage_plan is None
    few = {"a": 1, "b": 1, "c": 1, "d": 0}
    runner.input_batch.req_ids = ["a", "b", "c"]
    assert runner._build_attention_metadata(4, 3, 1, num_scheduled_tokens=few)[0] is None
    assert runner._afd_stage_plan is None


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA streams need a CUDA device (run on a GPU host)"
)
#: GPU cycles of the kernel one stage leaves queued (about a second on current GPUs):
#: far longer than a small copy to the host, and than any host scheduling gap.
SLEEP_CYCLES = 2_000_000_000


@needs_cuda
@pytest.mark.parametrize("streams", ["per-stage", "shared"])
def test_a_stages_copy_to_the_host_waits_for_the_other_stages_kernels_only_on_a_shared_stream(
    streams: str,
) -> None:
    """Stage 1 leaves a long kernel queued and hands the turn back; stage 0 then copies a
    tensor to the host. With a stream per stage the copy returns while stage 1's kernel
    still runs; with one shared stream it returns only after that kernel. Either way the
    worker's stream is ordered after both stages when the step returns. The kernels and
    the copy run once before the step: CUDA loads a kernel's module at its first launch,
    and that load waits for the device's running kernels on any stream (on an H100 the
    first ``x * 2`` after a queued sleep waited for it), which is not what is tested here
    and which vLLM's warm-up pass takes before serving."""
    forward = TwoStageForward(POLICY, timeout_s=30, streams=streams)  # type: ignore[arg-type]
    caller = torch.cuda.current_stream()
    x = torch.arange(4.0, device="cuda")
    torch.cuda._sleep(1)
    (x * 2).cpu()
    x.add(1)
    torch.cuda.synchronize()
    done: dict[str, bool] = {}
    used: list[torch.cuda.Stream] = []
    slow = torch.cuda.Event()

    def stage0() -> torch.Tensor:
        used.append(torch.cuda.current_stream())
        y = x * 2
        forward.checkpoint()  # stage 1 queues its long kernel
        host = y.cpu()
        done["slow kernel finished before the copy returned"] = slow.query()
        return host

    def stage1() -> torch.Tensor:
        used.append(torch.cuda.current_stream())
        torch.cuda._sleep(SLEEP_CYCLES)
        z = x + 1
        slow.record()
        forward.checkpoint()
        return z

    try:
        host, z = forward.run([object(), object()], [stage0, stage1])
    finally:
        forward.close()
    assert host.tolist() == [0.0, 2.0, 4.0, 6.0]
    if streams == "per-stage":
        assert used[0] != used[1] and caller not in used
        assert done == {"slow kernel finished before the copy returned": False}
    else:
        assert used == [caller, caller]
        assert done == {"slow kernel finished before the copy returned": True}
    # The caller's stream follows both stages: a kernel queued now sees stage 1's result.
    assert (z * 1).tolist() == [1.0, 2.0, 3.0, 4.0]
    after = torch.cuda.Event()
    after.record(caller)
    after.synchronize()
    assert slow.query()
