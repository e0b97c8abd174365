"""What the cost model needs to know about a model, read from its ``config.json``.

Three architectures are understood, with the field names of their Hugging Face configs
(the ones afd-models wraps and ``python -m afd_models.tiny`` writes):

* ``Qwen3MoeForCausalLM``: grouped-query attention (``num_attention_heads``,
  ``num_key_value_heads``, ``head_dim``); routed experts ``num_experts`` (or
  ``num_local_experts``), ``num_experts_per_tok``, ``moe_intermediate_size``; a layer is
  sparse unless it is in ``mlp_only_layers`` or ``(layer + 1) % decoder_sparse_step``;
  dense layers use ``intermediate_size``; no shared expert.
* ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``: multi-head latent attention
  (``q_lora_rank`` (may be null), ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``); routed experts ``n_routed_experts``;
  ``n_shared_experts`` shared experts of ``moe_intermediate_size``; a layer is sparse
  when ``layer >= first_k_dense_replace`` and ``layer % moe_layer_freq == 0`` (the rule
  of vLLM's ``DeepseekV2DecoderLayer``).

Weights take the bytes of ``dtype`` (``torch_dtype`` in older configs; bf16 when absent),
or one byte with ``quantization_config.quant_method == "fp8"``; activations and the KV
cache are 16-bit. Anything else is an :class:`~afd_core.errors.AFDConfigError` that names
the key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from afd_core.errors import AFDConfigError

#: Bytes of one element of each dtype name a config may give.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: Bytes of an activation and of a KV cache element (vLLM serves these in 16 bits).
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class AttentionShape:
    """One decoder layer's attention. ``kind`` is ``"gqa"`` or ``"mla"``.

    GQA uses ``num_kv_heads`` and ``head_dim``; MLA uses the ``*_rank`` and ``*_head_dim``
    fields (``q_lora_rank`` 0 means queries are projected directly from the hidden state).
    """

    kind: str
    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def params(self, hidden: int) -> int:
        """Weight elements of the layer's projections (norms left out)."""
        if self.kind == "gqa":
            q_and_o = 2 * hidden * self.num_heads * self.head_dim
            return q_and_o + 2 * hidden * self.num_kv_heads * self.head_dim
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_head
        else:
            q = hidden * self.num_heads * qk_head
        kv_a = hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + self.num_heads * self.v_head_dim * hidden

    @property
    def kv_elements_per_token(self) -> int:
        """KV cache elements one token keeps in one layer (MLA: the compressed latent)."""
        if self.kind == "gqa":
            return 2 * self.num_kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def decode_flops_per_context_token(self) -> int:
        """FLOPs one decoding token spends per cached token (scores and weighted sum).

        MLA decodes in the absorbed form (vLLM's MLA backends): both products run over the
        latent, ``kv_lora_rank + qk_rope_head_dim`` wide for the scores.
        """
        if self.kind == "gqa":
            return 4 * self.num_heads * self.head_dim
        return 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def prefill_flops_per_token_pair(self) -> int:
        """FLOPs per (query, key) pair of a prefill (MLA prefills in the expanded form)."""
        if self.kind == "gqa":
            return 4 * self.num_heads * self.head_dim
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        return 2 * self.num_heads * (qk_head + self.v_head_dim)


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a decode step's cost and memory.

    ``moe_layers`` of ``num_layers`` decoder layers are sparse; the others have a dense
    MLP of ``dense_intermediate``. Every sparse layer has ``num_experts`` routed experts
    of ``expert_intermediate`` (``experts_per_token`` per token) and ``shared_experts``
    shared experts of the same width. ``weight_bytes`` is per weight element.
    """

    architecture: str
    hidden_size: int
    num_layers: int
    moe_layers: int
    vocab_size: int
    attention: AttentionShape
    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    shared_experts: int
    dense_intermediate: int
    weight_bytes: float
    tied_embeddings: bool = False
    max_context: int = 0

    @property
    def dense_layers(self) -> int:
        """Decoder layers with a dense MLP instead of experts."""
        return self.num_layers - self.moe_layers

    @property
    def attention_params(self) -> int:
        """Attention weight elements of one layer."""
        return self.attention.params(self.hidden_size)

    @property
    def expert_params(self) -> int:
        """Weight elements of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_intermediate

    @property
    def shared_params(self) -> int:
        """Weight elements of one sparse layer's shared experts and router gate."""
        shared = self.shared_experts * self.expert_params
        return shared + self.hidden_size * self.num_experts

    @property
    def dense_params(self) -> int:
        """Weight elements of one dense MLP."""
        return 3 * self.hidden_size * self.dense_intermediate

    @property
    def embedding_params(self) -> int:
        """Weight elements of the embedding and the LM head (once when tied)."""
        tables = 1 if self.tied_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token of context takes over all layers."""
        return self.num_layers * self.attention.kv_elements_per_token * ACTIVATION_BYTES

    def fingerprint(self) -> dict[str, Any]:
        """The per-layer shape as plain data: what a measured profile must match."""
        return {
            "architecture": self.architecture,
            "hidden_size": self.hidden_size,
            "attention": asdict(self.attention),
            "num_experts": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "expert_intermediate": self.expert_intermediate,
            "shared_experts": self.shared_experts,
            "dense_intermediate": self.dense_intermediate,
            "weight_bytes": self.weight_bytes,
        }


def load_model_shape(model_dir: Path) -> ModelShape:
    """The shape of the model in ``model_dir`` (its ``config.json``).

    Raises AFDConfigError when the file is missing, is not a JSON object, names an
    architecture this module does not model, or lacks or mistypes a field.
    """
    path = model_dir / "config.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AFDConfigError(
            f"cannot read {path} ({exc.strerror or exc}); pass a Hugging Face model directory"
        ) from exc
    except json.JSONDecodeError as exc:
        raise AFDConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(document, dict):
        raise AFDConfigError(f"{path} must hold a JSON object")
    return model_shape_from_config(document, source=str(path))


def model_shape_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape described by a parsed ``config.json`` (``source`` names it in errors)."""
    fields = _Fields(config, source)
    architectures = config.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else None
    parser = _PARSERS.get(name) if isinstance(name, str) else None
    if parser is None:
        raise AFDConfigError(
            f"{source}: architectures is {architectures!r}; afd plan models "
            f"{', '.join(sorted(_PARSERS))}"
        )
    specific = parser(fields)
    return ModelShape(
        architecture=name,
        hidden_size=fields.integer("hidden_size"),
        num_layers=fields.integer("num_hidden_layers"),
        moe_layers=specific.moe_layers,
        vocab_size=fields.integer("vocab_size"),
        attention=specific.attention,
        num_experts=specific.num_experts,
        experts_per_token=_top_k(fields, specific.num_experts),
        expert_intermediate=fields.integer("moe_intermediate_size"),
        shared_experts=specific.shared_experts,
        dense_intermediate=fields.integer("intermediate_size", default=0, minimum=0),
        weight_bytes=fields.weight_bytes(),
        tied_embeddings=bool(fields.config.get("tie_word_embeddings", False)),
        max_context=fields.integer("max_position_embeddings", default=0, minimum=0),
    )


class _Fields:
    """Typed reads of config keys, each failure an error naming the key."""

    def __init__(self, config: Mapping[str, Any], source: str) -> None:
        self.config = config
        self.source = source

    def integer(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise AFDConfigError(
                    f"{self.source}: {key} is {value!r}; it must be an integer >= {minimum}"
                )
            return value
        if default is not None:
            return default
        raise AFDConfigError(f"{self.source}: {' or '.join(keys)} is missing; add it")

    def weight_bytes(self) -> float:
        dtype = self.config.get("dtype", self.config.get("torch_dtype", "bfloat16"))
        if dtype not in DTYPE_BYTES:
            raise AFDConfigError(
                f"{self.source}: dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
            )
        quantization = self.config.get("quantization_config")
        if quantization is None:
            return DTYPE_BYTES[dtype]
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        if method != "fp8":
            raise AFDConfigError(
                f"{self.source}: quantization_config.quant_method {method!r} is not modelled "
                "(only fp8); plan a copy of config.json without quantization_config"
            )
        return 1


@dataclass(frozen=True)
class _Specific:
    """What an architecture's config says in its own words."""

    attention: AttentionShape
    moe_layers: int
    num_experts: int
    shared_experts: int


def _qwen3_moe(f: _Fields) -> _Specific:
    layers = f.integer("num_hidden_layers")
    heads = f.integer("num_attention_heads")
    only_mlp = f.config.get("mlp_only_layers") or []
    step = f.integer("decoder_sparse_step", default=1)
    return _Specific(
        attention=AttentionShape(
            kind="gqa",
            num_heads=heads,
            num_kv_heads=f.integer("num_key_value_heads", default=heads),
            head_dim=f.integer("head_dim", default=f.integer("hidden_size") // heads),
        ),
        moe_layers=sum(1 for i in range(layers) if i not in only_mlp and (i + 1) % step == 0),
        num_experts=f.integer("num_experts", "num_local_experts"),
        shared_experts=0,
    )


def _deepseek(f: _Fields) -> _Specific:
    layers = f.integer("num_hidden_layers")
    first_dense = f.integer("first_k_dense_replace", default=0, minimum=0)
    freq = f.integer("moe_layer_freq", default=1)
    return _Specific(
        attention=AttentionShape(
            kind="mla",
            num_heads=f.integer("num_attention_heads"),
            q_lora_rank=f.integer("q_lora_rank", default=0, minimum=0),
            kv_lora_rank=f.integer("kv_lora_rank"),
            qk_nope_head_dim=f.integer("qk_nope_head_dim"),
            qk_rope_head_dim=f.integer("qk_rope_head_dim"),
            v_head_dim=f.integer("v_head_dim"),
        ),
        moe_layers=sum(1 for i in range(layers) if i >= first_dense and i % freq == 0),
        num_experts=f.integer("n_routed_experts"),
        shared_experts=f.integer("n_shared_experts", default=0, minimum=0),
    )


def _top_k(f: _Fields, experts: int) -> int:
    top_k = f.integer("num_experts_per_tok")
    if top_k > experts:
        raise AFDConfigError(
            f"{f.source}: num_experts_per_tok ({top_k}) exceeds the routed experts ({experts})"
        )
    return top_k


_PARSERS: dict[str, Callable[[_Fields], _Specific]] = {
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
}
