"""What the role wrappers promise, and the helpers they share.

A wrapper is registered with vLLM under a stock Hugging Face architecture name (for
example ``Qwen3MoeForCausalLM``). Without ``additional_config["afd"]`` it *is* the stock
class. With it, :class:`RoleDispatch` builds the role class instead:

* the **attention role** model (:class:`AttentionModel`) keeps embeddings, attention,
  norms, the final norm and ``lm_head`` (plus the MoE gate when
  ``compute_gate_on_attention``), and hands every decoder layer's MLP input to
  ``torch.ops.afd.exchange`` (:mod:`afd_models.exchange_op`), which calls the process's
  :class:`Exchanger`;
* the **FFN role** model (:class:`FFNModel`) holds only the MLP/MoE blocks and is driven
  layer by layer by the FFN loop through :meth:`FFNModel.afd_compute_ffn`.

No torch or vLLM import at module level: the protocols are usable by code that only
type-checks against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from afd_core.config import AFDConfig, afd_config_from_vllm
from afd_core.connector import ExpertRouting, WireSpec
from afd_core.errors import AFDConfigError
from afd_core.topology import Role

if TYPE_CHECKING:
    import torch

FFN_NOT_SCHEDULED = (
    "the FFN role is driven by the connector, not the scheduler: {what} is never called "
    "on an FFN deployment (its worker runs the FFN loop, which calls afd_compute_ffn); "
    "send requests to the attention deployment"
)


class Exchanger(Protocol):
    """The attention side of one exchange per decoder layer.

    Installed per process with :func:`afd_models.exchange_op.set_exchanger` by the
    attention worker; called by ``torch.ops.afd.exchange`` from every decoder layer.
    """

    def exchange(
        self, hidden: torch.Tensor, router_logits: torch.Tensor | None, layer: int
    ) -> torch.Tensor:
        """Send ``hidden`` (``[tokens, hidden_size]``, the normed MLP input of ``layer``)
        and, when the gate runs on attention, ``router_logits`` (``[tokens, experts]``)
        to the FFN role; return the FFN output for ``layer``.

        The result must be a new tensor (not a view of ``hidden``) with the shape and
        dtype of ``hidden``. ``hidden`` may be non-contiguous. Called once per layer in
        layer order, during every forward of the attention model (profile, warm-up and
        dummy runs included).
        """
        ...


@runtime_checkable
class AttentionModel(Protocol):
    """The attention role model: a stock model whose MLPs exchange with the FFN role."""

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """The decoder layers that exchange per forward, in call order (all of them)."""
        ...

    def afd_wire_spec(self) -> WireSpec:
        """The shapes this role sends and expects (compared at rendezvous)."""
        ...


@runtime_checkable
class FFNModel(Protocol):
    """The FFN role model: only the MLP/MoE blocks of every decoder layer."""

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """The decoder layers that exchange per forward, in call order (all of them)."""
        ...

    def afd_compute_ffn(
        self, layer: int, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> torch.Tensor:
        """Run decoder layer ``layer``'s MLP/MoE block on ``hidden`` ``[tokens, hidden]``.

        ``router_logits`` (``[tokens, experts]``) must be given for MoE layers exactly
        when the gate runs on the attention role, and be None otherwise. Returns a new
        ``[tokens, hidden]`` tensor, bit-identical to what the stock block returns inside
        the monolithic model. Must run inside a vLLM forward context of this model's
        VllmConfig (``with set_forward_context(None, vllm_config):``): the MoE runners
        find themselves through it. The caller (the FFN loop) sets it.
        """
        ...

    def afd_compute_experts(
        self, layer: int, hidden: torch.Tensor, routing: ExpertRouting
    ) -> torch.Tensor:
        """Expert-routed deployments: this FFN rank's routed experts of MoE layer
        ``layer`` on ``hidden`` ``[rows, hidden]`` with ``routing`` (local expert ids,
        weights; weight 0 for experts of other ranks). Returns the weighted sum of its
        experts per row, a new ``[rows, hidden]`` tensor; same forward context as
        :meth:`afd_compute_ffn`.
        """
        ...

    def afd_wire_spec(self) -> WireSpec:
        """The shapes this role receives and returns (compared at rendezvous)."""
        ...


def afd_config(vllm_config: Any) -> AFDConfig | None:
    """This deployment's AFD settings, or None when ``additional_config`` has no "afd".

    Raises AFDConfigError for parallel settings the role wrappers cannot split:
    pipeline parallelism and sequence-parallel MoE.
    """
    config = afd_config_from_vllm(vllm_config)
    if config is None:
        return None
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        raise AFDConfigError(
            f"AFD config: pipeline_parallel_size ({parallel.pipeline_parallel_size}) must "
            "be 1: every decoder layer exchanges with the FFN role, so the attention role "
            "cannot be split into pipeline stages; use tensor or data parallelism"
        )
    if parallel.use_sequence_parallel_moe:
        raise AFDConfigError(
            "AFD config: sequence-parallel MoE is not supported (the FFN role runs the "
            "MoE on whole batches); turn off sequence-parallel MoE"
        )
    return config


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the form used on the wire)."""
    return str(dtype).removeprefix("torch.")


def make_wire_spec(
    vllm_config: Any,
    afd: AFDConfig,
    *,
    num_layers: int,
    num_experts: int,
    top_k: int,
    router_logits_dtype: torch.dtype,
    dense_layers: tuple[int, ...] = (),
) -> WireSpec:
    """The :class:`WireSpec` of a checkpoint; both roles compute the same value.

    ``router_logits_width`` is ``num_experts`` when the gate runs on attention, else 0;
    ``dense_layers`` are the layers without a router (their messages carry no logits).
    With an expert-routed connector only the MoE layers exchange (dense MLPs and shared
    experts run on the attention role, see :mod:`afd_models.routed`).
    """
    model_config = vllm_config.model_config
    hf_config = model_config.hf_text_config
    architectures = getattr(model_config.hf_config, "architectures", None) or ["?"]
    fingerprint = (
        f"{architectures[0]}:h{hf_config.hidden_size}:l{num_layers}"
        f":e{num_experts}:v{hf_config.vocab_size}"
    )
    exchanged: tuple[int, ...] = ()
    if afd.splits_experts:
        exchanged = tuple(layer for layer in range(num_layers) if layer not in dense_layers)
    return WireSpec(
        hidden_size=hf_config.hidden_size,
        dtype=dtype_name(model_config.dtype),
        num_exchange_layers=len(exchanged) if exchanged else num_layers,
        router_logits_width=num_experts if afd.compute_gate_on_attention else 0,
        router_logits_dtype=dtype_name(router_logits_dtype),
        model_fingerprint=fingerprint,
        dense_layers=dense_layers,
        num_experts=num_experts,
        top_k=top_k,
        exchange_layer_ids=exchanged,
    )


def ffn_role_rank(vllm_config: Any, afd: AFDConfig) -> int:
    """This FFN worker's rank (as its worker will resolve it), while its model is built."""
    from vllm.distributed import get_tensor_model_parallel_rank

    from afd_core.workers.setup import resolve_role_rank

    return resolve_role_rank(afd, vllm_config.parallel_config, get_tensor_model_parallel_rank())


def clear_moe_attributes(model: Any) -> None:
    """Give an attention role model vLLM's MixtureOfExperts fields with no local experts.

    With ``num_moe_layers == 0`` vLLM does not treat the model as an MoE model (no EPLB
    state, no expert bookkeeping): the experts live on the FFN role.
    """
    model.moe_layers = []
    model.moe_mlp_layers = []
    model.num_moe_layers = 0
    model.num_expert_groups = 0
    model.num_logical_experts = 0
    model.num_physical_experts = 0
    model.num_local_physical_experts = 0
    model.num_routed_experts = 0
    model.num_shared_experts = 0
    model.num_redundant_experts = 0


class RoleDispatch:
    """Mixin of a registered wrapper: builds the role class that the config asks for.

    vLLM constructs the registered class as ``cls(vllm_config=..., prefix=...)``.
    Without ``additional_config["afd"]`` that is the stock class (the wrapper adds no
    ``__init__``); with it, ``__new__`` returns an instance of ``afd_role_classes[role]``
    (a subclass, so Python then runs that subclass's ``__init__``).

    Each registered wrapper gets its own ``afd_role_classes``, assigned once its role
    subclasses exist; constructing a role class directly does not dispatch again.
    """

    afd_role_classes: ClassVar[Mapping[Role, type]] = MappingProxyType({})

    def __new__(cls, *args: Any, vllm_config: Any = None, **kwargs: Any) -> Any:
        target = cls
        if "afd_role_classes" in vars(cls) and vllm_config is not None:
            config = afd_config(vllm_config)
            if config is not None:
                target = cls.afd_role_classes[config.role]
        return super().__new__(target)
