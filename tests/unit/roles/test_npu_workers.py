"""The NPU workers' logic, with vllm-ascend's classes replaced by recording fakes.

vllm-ascend and torch-npu cannot be installed here (``docs/ascend.md``), so the modules
``afd_attention.worker_npu`` and ``afd_ffn.worker_npu`` are imported over fake
``vllm_ascend`` modules installed in ``sys.modules`` for the test: each fake records the
device calls the workers make (runner construction, the V1 runner's positional
``_model_forward``, the Ascend forward context). Their signatures are checked separately
against the committed stubs (``tests/typecheck``).
"""

from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager
from typing import Any

import pytest

from afd_attention.step_driver import METADATA_KEY, StepDriver
from afd_ffn.server import FFNServer
from tests.unit.roles.fakes import (
    WIRE,
    FakeFFNModel,
    FakeStream,
    FakeTensor,
    RecordingConnector,
    ffn_step,
    make_config,
)

pytest.importorskip("vllm")  # the worker mixins import vLLM's worker base

NPU_MODULES = ("afd_attention.worker_npu", "afd_ffn.worker_npu")


class StockNPURunner:
    """vllm-ascend's V1 ``NPUModelRunner``: ``_model_forward`` takes the padded count first
    and runs the "model", which exchanges every layer through the step driver."""

    def __init__(self, vllm_config: Any, device: Any) -> None:
        self.built_with = (vllm_config, device)
        self.forward_calls: list[tuple[Any, ...]] = []
        self.driver: StepDriver | None = None
        #: vllm-ascend's extras in the forward context (V2 reads them from additional_kwargs).
        self.forward_kwargs: dict[str, Any] = {}

    def _model_forward(self, num_tokens_padded, input_ids=None, positions=None,
                       intermediate_tensors=None, inputs_embeds=None, **model_kwargs):  # fmt: skip
        self.forward_calls.append((num_tokens_padded, input_ids, positions, model_kwargs))
        tokens = input_ids if input_ids is not None else inputs_embeds
        for layer in range(WIRE.num_exchange_layers):
            self.driver.exchange(FakeTensor((tokens.shape[0], 8)), None, layer)
        return "hidden"


class StockNPURunnerV2(StockNPURunner):
    """vllm-ascend's Model Runner V2 (only its construction matters here)."""


class StockNPUWorker:
    """vllm-ascend's ``NPUWorker``: ``init_device`` sets the device and builds a stock runner
    inline."""

    def __init__(self, vllm_config: Any, use_v2_model_runner: bool = False) -> None:
        self.vllm_config = vllm_config
        self.use_v2_model_runner = use_v2_model_runner
        self.device: Any = None
        self.model_runner: Any = None

    def init_device(self) -> None:
        self.device = "npu:3"
        runner = StockNPURunnerV2 if self.use_v2_model_runner else StockNPURunner
        self.model_runner = runner(self.vllm_config, self.device)


class AscendForwardContexts:
    """``set_ascend_forward_context``: records its arguments and how deep it is entered."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.depth = 0

    @contextmanager
    def __call__(self, *args: Any, **kwargs: Any):
        self.calls.append((args, kwargs))
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


@pytest.fixture
def ascend(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Fake vllm_ascend modules in sys.modules, and the NPU worker modules imported anew
    over them (and forgotten afterwards)."""
    contexts = AscendForwardContexts()
    modules = {
        "vllm_ascend": {},
        "vllm_ascend.worker": {},
        "vllm_ascend.worker.worker": {"NPUWorker": StockNPUWorker},
        "vllm_ascend.worker.model_runner_v1": {"NPUModelRunner": StockNPURunner},
        "vllm_ascend.worker.v2": {},
        "vllm_ascend.worker.v2.model_runner": {"NPUModelRunner": StockNPURunnerV2},
        "vllm_ascend.ascend_forward_context": {"set_ascend_forward_context": contexts},
    }
    for name, members in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(members)
        monkeypatch.setitem(sys.modules, name, module)
    for name in NPU_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    imported = {name.split(".")[0]: importlib.import_module(name) for name in NPU_MODULES}
    yield types.SimpleNamespace(contexts=contexts, **imported)
    for name in NPU_MODULES:
        sys.modules.pop(name, None)


def attention_worker(ascend: types.SimpleNamespace, *, v2: bool) -> Any:
    worker_class = ascend.afd_attention.AFDAttentionNPUWorker
    worker = worker_class.__new__(worker_class)
    StockNPUWorker.__init__(worker, "vllm-config", use_v2_model_runner=v2)
    return worker


@pytest.mark.parametrize(("v2", "runner_name"), [
    (False, "AFDAttentionNPUModelRunner"),
    (True, "AFDAttentionNPUModelRunnerV2"),
])  # fmt: skip
def test_init_device_replaces_the_stock_runner_with_the_attention_runner_of_its_generation(
    ascend, v2, runner_name
):
    worker = attention_worker(ascend, v2=v2)
    worker.init_device()
    runner = worker.model_runner
    assert type(runner) is getattr(ascend.afd_attention, runner_name)
    # Built from what NPUWorker built its own runner from, after the device was set.
    assert runner.built_with == ("vllm-config", "npu:3")


def make_npu_runner(ascend: types.SimpleNamespace) -> tuple[Any, RecordingConnector]:
    runner = ascend.afd_attention.AFDAttentionNPUModelRunner("vllm-config", "npu:0")
    # Reads vLLM's forward context, which a real forward sets: an eager step here.
    runner._afd_replays_full_graph = lambda: False
    connector = RecordingConnector(make_config(), 0)
    runner.afd_driver = runner.driver = StepDriver(
        connector,
        WIRE,
        0,
        step_slot=lambda: runner.forward_kwargs,
        is_capturing=FakeStream().is_capturing,
    )
    return runner, connector


def test_the_v1_runner_passes_the_padded_count_on_by_position_and_steps_with_the_real_count(
    ascend,
):
    runner, connector = make_npu_runner(ascend)
    ids, positions = FakeTensor((5,)), FakeTensor((5,))
    # vllm-ascend calls it positionally: (num_tokens_padded, input_ids, positions, ...).
    assert runner._model_forward(8, ids, positions, None, None, extra=1) == "hidden"
    ((padded, got_ids, got_positions, kwargs),) = runner.forward_calls
    assert (padded, got_ids, got_positions, kwargs) == (8, ids, positions, {"extra": 1})
    (payload,) = [call[0] for call in connector.calls("begin_step")]
    assert payload.tokens_of(0) == (5,)  # the scheduled tokens, not the padded count
    sent_layers = [call[0] for call in connector.calls("send")]
    assert sent_layers == list(range(WIRE.num_exchange_layers))


def test_the_step_metadata_is_added_to_vllm_ascends_forward_context_extras(ascend):
    runner, _ = make_npu_runner(ascend)
    extras = {"moe_comm_type": "MC2", "mc2_mask": "mask"}
    runner.forward_kwargs = dict(extras)
    runner._model_forward(4, FakeTensor((4,)))
    assert {k: runner.forward_kwargs[k] for k in extras} == extras
    assert runner.forward_kwargs[METADATA_KEY].step_id == 0


def test_the_ffn_worker_sizes_each_batch_context_by_the_batch(ascend):
    worker_class = ascend.afd_ffn.AFDFFNNPUWorker
    worker = worker_class.__new__(worker_class)
    StockNPUWorker.__init__(worker, "vllm-config")
    with worker.afd_batch_context(7):
        assert ascend.contexts.depth == 1
    assert ascend.contexts.calls == [((None, "vllm-config"), {"num_tokens": 7})]


def test_the_ffn_server_opens_one_batch_context_per_received_batch_inside_the_step():
    connector = RecordingConnector(make_config("ffn"), 0)
    opened: list[tuple[str, int]] = []
    step_open = []

    @contextmanager
    def step_context():
        step_open.append(True)
        try:
            yield
        finally:
            step_open.pop()

    @contextmanager
    def batch_context(rows: int):
        assert step_open, "a batch context outside the step's"
        opened.append(("batch", rows))
        yield

    failures: list[BaseException] = []
    server = FFNServer(
        connector,
        FakeFFNModel(),
        compute_context=step_context,
        batch_context=batch_context,
        on_failure=failures.append,
    )
    for item in (ffn_step(0, 5), ffn_step(1, 2, 3), None):
        connector.steps.put(item)
    server.start()
    server._thread.join(30.0)
    assert not server.is_running and not failures
    # Layer-major: per layer, one context per stage's batch, sized by its rows.
    assert opened == [("batch", 5)] * 3 + [("batch", 2), ("batch", 3)] * 3
