"""The AFD roles of a multimodal model served with ``--language-model-only``.

vLLM's multimodal classes (``Qwen3_5MoeForConditionalGeneration``, ...) hold a vision tower
(``visual``) and a text causal LM (``language_model``) built from a class of their vLLM
model module. With ``--language-model-only`` vLLM builds no tower (every modality limit
is 0, so ``_mark_tower_model`` leaves a ``StageMissingLayer``) and the model is its
language model. Its roles are that language model's roles, from the wrapper afd-models
registers for the text architecture:

* attention role: the stock multimodal ``__init__`` while the text class's name in the
  model module resolves to the text wrapper, which builds its attention role for the
  AFD config (:class:`afd_models.roles.RoleDispatch`); the stock forward, loader (outer
  name mapper, then the text role's own split) and logits;
* FFN role: only the text wrapper's FFN role, as ``language_model``: no tower, no
  embeddings; the checkpoint goes through the stock outer name mapper first.

Both roles answer the AFD model protocols by asking ``language_model``. A multimodal
model served with its tower is refused at start-up: AFD splits only the decoder, and
images would reach the attention role's embeddings through a tower that is not there.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn
from vllm.model_executor.models.utils import maybe_prefix

from afd_core.errors import AFDConfigError
from afd_models.layers import stand_ins
from afd_models.role_mixins import NotScheduled
from afd_models.roles import clear_moe_attributes

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig

    from afd_core.connector import ExpertRouting, WireSpec
    from afd_core.placement import ExpertPlacement

#: The modalities whose towers must be off (vLLM's ``_mark_tower_model`` of the model).
MODALITIES = ("image", "video")

#: vLLM's MixtureOfExperts fields, copied from the FFN role's language model.
_EXPERT_FIELDS = (
    "moe_layers",
    "num_moe_layers",
    "num_expert_groups",
    "num_shared_experts",
    "num_logical_experts",
    "num_physical_experts",
    "num_local_physical_experts",
    "num_routed_experts",
    "num_redundant_experts",
)


def require_language_model_only(vllm_config: VllmConfig) -> None:
    """Raise AFDConfigError unless every modality of the model is turned off."""
    model_config = vllm_config.model_config
    mm_config = model_config.multimodal_config
    if mm_config is None:
        return
    open_modalities = [m for m in MODALITIES if mm_config.get_limit_per_prompt(m) != 0]
    if open_modalities:
        architecture = (model_config.architectures or ["?"])[0]
        raise AFDConfigError(
            f"AFD: {architecture} is served with its vision tower (modalities "
            f"{', '.join(open_modalities)} allowed), but AFD splits only its language "
            "model; serve it with --language-model-only (or --limit-mm-per-prompt 0 for "
            "every modality)"
        )


class LanguageModelRole:
    """What both roles share: the AFD protocols answered by ``language_model``.

    A role class sets ``afd_text_wrapper``: the text wrapper afd-models registers for the
    language model's architecture (a :class:`~afd_models.roles.RoleDispatch` class).
    """

    afd_text_wrapper: ClassVar[type[nn.Module]]
    language_model: Any

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """The language model's exchanging decoder layers, in order."""
        return self.language_model.afd_exchange_layers()

    def afd_wire_spec(self) -> WireSpec:
        """The language model's wire spec (its fingerprint names the multimodal class)."""
        return self.language_model.afd_wire_spec()

    @property
    def afd_placement(self) -> ExpertPlacement | None:
        """The language model's expert blocks (expert-routed), else None."""
        return self.language_model.afd_placement


class LanguageModelAttentionRole(LanguageModelRole):
    """The attention role: the stock multimodal model around the text attention role.

    A role class also sets ``afd_text_module`` and ``afd_text_class``: the vLLM model
    module and the name in it the stock ``__init__`` builds ``language_model`` from.
    """

    afd_text_module: ClassVar[ModuleType]
    afd_text_class: ClassVar[str]

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        require_language_model_only(vllm_config)
        with stand_ins(self.afd_text_module, **{self.afd_text_class: self.afd_text_wrapper}):
            super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]

    def set_moe_parameters(self) -> None:
        """Called by the stock ``__init__``: no local experts on the attention role."""
        clear_moe_attributes(self)


class LanguageModelFFNRole(LanguageModelRole, NotScheduled):
    """The FFN role: only the text FFN role, under ``language_model``.

    A role class also inherits the stock class's ``hf_to_vllm_mapper``.
    """

    hf_to_vllm_mapper: Any

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        require_language_model_only(vllm_config)
        nn.Module.__init__(self)  # type: ignore[arg-type]
        self.config = vllm_config.model_config.hf_config
        self.language_model = self.afd_text_wrapper(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "language_model")
        )
        self.set_moe_parameters()

    def set_moe_parameters(self) -> None:
        """vLLM's MixtureOfExperts fields: those of the language model's FFN role."""
        for field in _EXPERT_FIELDS:
            setattr(self, field, getattr(self.language_model, field))

    def afd_compute_ffn(
        self, layer: int, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> torch.Tensor:
        """See :meth:`afd_models.roles.FFNModel.afd_compute_ffn`."""
        return self.language_model.afd_compute_ffn(layer, hidden, router_logits)

    def afd_compute_experts(
        self, layer: int, hidden: torch.Tensor, routing: ExpertRouting
    ) -> torch.Tensor:
        """See :meth:`afd_models.roles.FFNModel.afd_compute_experts`."""
        return self.language_model.afd_compute_experts(layer, hidden, routing)

    def afd_loaded_experts(self) -> dict[str, Any] | None:
        """The language model's expert blocks (expert-routed), else None."""
        return self.language_model.afd_loaded_experts()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stock outer mapper, then the language model's tensors to its FFN role
        (the tower's tensors, which no FFN rank holds, are dropped)."""
        prefix = "language_model."
        inner = (
            (name.removeprefix(prefix), tensor)
            for name, tensor in self.hf_to_vllm_mapper.apply(weights)
            if name.startswith(prefix)
        )
        return {prefix + name for name in self.language_model.load_weights(inner)}
