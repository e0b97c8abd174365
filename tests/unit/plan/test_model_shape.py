"""config.json to ModelShape: the field names of Qwen3-MoE and DeepSeek-V2/V3, and an
error naming the key for anything the cost model cannot use."""

from __future__ import annotations

import json

import pytest

from afd_core.errors import AFDConfigError
from afd_core.plan.model_shape import load_model_shape, model_shape_from_config
from tests.unit.plan.conftest import MODELS, tiny_config, write_model


def test_tiny_qwen3_moe_has_three_sparse_gqa_layers():
    shape = model_shape_from_config(tiny_config("tiny-qwen3-moe"))
    assert (shape.num_layers, shape.moe_layers, shape.dense_layers) == (3, 3, 0)
    assert shape.attention.kind == "gqa" and shape.shared_experts == 0
    # keys and values of 2 KV heads of 32, bf16, in 3 layers
    assert shape.kv_bytes_per_token == 3 * 2 * 2 * 32 * 2


def test_tiny_deepseek_v2_caches_the_compressed_latent_and_has_a_dense_first_layer():
    shape = model_shape_from_config(tiny_config("tiny-deepseek-v2"))
    assert (shape.moe_layers, shape.dense_layers) == (2, 1)
    assert shape.attention.kind == "mla" and shape.shared_experts == 1
    assert shape.kv_bytes_per_token == 3 * (512 + 64) * 2


def test_deepseek_v3_fp8_has_58_sparse_layers_and_one_byte_weights():
    shape = load_model_shape(MODELS / "deepseek-v3")
    assert (shape.moe_layers, shape.dense_layers, shape.weight_bytes) == (58, 3, 1)
    assert shape.kv_bytes_per_token == 61 * 576 * 2
    # 256 routed experts of 3 x 7168 x 2048 in 58 layers: about 654 G parameters
    assert shape.moe_layers * shape.num_experts * shape.expert_params == pytest.approx(
        654e9, rel=0.01
    )


def test_qwen3_mlp_only_layers_and_sparse_step_make_dense_layers():
    config = tiny_config("tiny-qwen3-moe") | {"mlp_only_layers": [0], "decoder_sparse_step": 1}
    assert model_shape_from_config(config).moe_layers == 2


def test_transformers_5_configs_name_the_qwen3_expert_count_num_local_experts():
    config = tiny_config("tiny-qwen3-moe")
    config["num_local_experts"] = config.pop("num_experts")
    assert model_shape_from_config(config).num_experts == 8


def test_older_configs_name_the_dtype_torch_dtype():
    config = tiny_config("tiny-qwen3-moe")
    del config["dtype"]
    assert model_shape_from_config(config | {"torch_dtype": "float32"}).weight_bytes == 4


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "afd plan models"),
        ({"num_hidden_layers": None}, "num_hidden_layers is missing"),
        ({"hidden_size": "128"}, "hidden_size is '128'"),
        ({"num_experts_per_tok": 99}, "exceeds the routed experts"),
        ({"dtype": "int4"}, "dtype 'int4'"),
        ({"quantization_config": {"quant_method": "awq"}}, "not modelled"),
        ({"head_dim": True}, "head_dim is True"),
    ],
)
def test_a_config_the_model_cannot_use_is_an_error_naming_the_key(change, expected):
    config = {k: v for k, v in (tiny_config("tiny-qwen3-moe") | change).items() if v is not None}
    with pytest.raises(AFDConfigError, match=expected):
        model_shape_from_config(config)


def test_an_unreadable_or_invalid_config_file_is_an_afd_config_error(tmp_path):
    with pytest.raises(AFDConfigError, match="cannot read"):
        load_model_shape(tmp_path)
    (tmp_path / "config.json").write_text("{bad")
    with pytest.raises(AFDConfigError, match="not valid JSON"):
        load_model_shape(tmp_path)
    write_model(tmp_path, {})
    (tmp_path / "config.json").write_text(json.dumps([1]))
    with pytest.raises(AFDConfigError, match="JSON object"):
        load_model_shape(tmp_path)
