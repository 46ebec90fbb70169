"""The demo's tiny models: configs transformers accepts and weights that match their tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moriio_tools.models import MODEL_NAMES, zoo_model
from moriio_tools.models.deepseek_v2 import TinyDeepseekV2
from moriio_tools.models.gemma2 import TinyGemma2
from moriio_tools.models.llama import TinyLlama
from moriio_tools.models.qwen3 import TinyQwen3
from moriio_tools.models.qwen3_next import TinyQwen3Next
from moriio_tools.models.store import ModelSpec, ensure_model


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo")
    return {name: ensure_model(root, zoo_model(name).spec) for name in MODEL_NAMES}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_written_weight_has_the_shape_of_its_table(
    written: dict[str, Path], name: str
) -> None:
    from safetensors import safe_open

    spec = zoo_model(name).spec
    table = dict(spec.tensor_shapes())
    assert len(table) == len(spec.tensor_shapes())  # no name twice
    with safe_open(str(written[name] / "model.safetensors"), "pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
        norm = f.get_tensor("model.norm.weight")
    assert shapes == table
    assert norm.eq(spec.norm_weight).all()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_transformers_accepts_every_config(written: dict[str, Path], name: str) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(written[name]))
    spec = zoo_model(name).spec
    assert config.architectures == spec.config()["architectures"]
    assert config.vocab_size == spec.vocab_size


def test_the_llama_keeps_its_directory_so_existing_caches_stay_valid() -> None:
    assert zoo_model("llama").spec == TinyLlama()
    assert TinyLlama().dirname == "tiny-llama-v1000-h128-i256-l4-a2-kv2-s0"


def test_every_model_has_its_own_directory_that_changes_with_the_seed() -> None:
    specs: list[ModelSpec] = [
        TinyLlama(),
        TinyDeepseekV2(),
        TinyQwen3(),
        TinyGemma2(),
        TinyQwen3Next(),
    ]
    names = {spec.dirname for spec in specs}
    assert len(names) == len(specs)
    assert TinyQwen3(seed=1).dirname != TinyQwen3().dirname
    assert TinyGemma2(sliding_window=32).dirname != TinyGemma2().dirname
    assert TinyDeepseekV2(v_head_dim=64).dirname != TinyDeepseekV2().dirname
    assert TinyQwen3Next(num_experts=8).dirname != TinyQwen3Next().dirname
    assert TinyQwen3Next(full_attention_interval=2).dirname != TinyQwen3Next().dirname


def test_the_deepseek_caches_one_576_wide_latent_and_has_dense_mlps_only() -> None:
    spec = TinyDeepseekV2()
    config = spec.config()
    assert config["kv_lora_rank"] == 512
    assert config["qk_rope_head_dim"] == 64
    assert config["q_lora_rank"] is None
    assert config["first_k_dense_replace"] == config["num_hidden_layers"]
    names = [name for name, _ in spec.tensor_shapes()]
    assert not [n for n in names if "experts" in n or "q_a_proj" in n]
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in names
    assert dict(spec.tensor_shapes())["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (
        576,
        128,
    )
    assert zoo_model("deepseek-v2").engine_args == ("--block-size", "16")


def test_the_gemma_alternates_sliding_and_full_layers_and_ties_its_output() -> None:
    config = TinyGemma2().config()
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["head_dim"] == 256
    assert config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in dict(TinyGemma2().tensor_shapes())


def test_qwen3_normalises_queries_and_keys_per_head() -> None:
    shapes = dict(TinyQwen3().tensor_shapes())
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (64,)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (128, 128)  # 2 KV heads of 64


def test_qwen3_next_has_three_linear_attention_layers_then_a_full_one_and_moe() -> None:
    spec = TinyQwen3Next()
    config = spec.config()
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    assert config["layer_types"] == kinds
    assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
    assert config["dtype"] == "bfloat16"
    shapes = dict(spec.tensor_shapes())
    # 2 key heads and 4 value heads of 64: q, k, v and the output gate z, interleaved
    assert shapes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == (768, 128)
    assert shapes["model.layers.0.linear_attn.conv1d.weight"] == (512, 1, 4)
    assert shapes["model.layers.0.linear_attn.A_log"] == (4,)
    assert "model.layers.0.self_attn.q_proj.weight" not in shapes
    # 4 query heads of 256, each with its output gate
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (2048, 128)
    assert "model.layers.3.linear_attn.in_proj_ba.weight" not in shapes
    assert shapes["model.layers.3.mlp.experts.3.down_proj.weight"] == (128, 64)
    assert shapes["model.layers.3.mlp.shared_expert_gate.weight"] == (1, 128)
    assert zoo_model("qwen3-next").engine_args == ("--dtype", "bfloat16", "--block-size", "64")


def test_the_written_qwen3_next_gates_its_linear_attention_with_nonzero_norms(
    written: dict[str, Path],
) -> None:
    from safetensors import safe_open

    # the decoder norms scale by 1 + weight, the gated output norm by the weight itself
    with safe_open(str(written["qwen3-next"] / "model.safetensors"), "pt") as f:
        gated = f.get_tensor("model.layers.0.linear_attn.norm.weight")
    assert gated.ne(0).all()


def test_an_unknown_model_name_is_refused() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        zoo_model("gpt-2")


def test_the_written_config_records_the_shape(written: dict[str, Path]) -> None:
    recorded = json.loads((written["qwen3"] / "moriio-model.json").read_text())
    assert recorded["head_dim"] == 64
    assert recorded["seed"] == 0
