"""What every tiny model's ``config.json`` and directory name share."""

from __future__ import annotations

from moriio_tools.models.shapes import DecoderShape


def decoder_config(shape: DecoderShape, architecture: str, model_type: str) -> dict[str, object]:
    """The keys every tiny model's config has: a SiLU decoder with RMSNorm, RoPE and an
    untied output, in float32 (a model adds its own keys and overrides these)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": shape.vocab_size,
    }


def model_dirname(family: str, shape: DecoderShape, sizes: str) -> str:
    """A directory name that changes whenever the shape or the seed does: the shared sizes,
    then ``sizes`` (the family's own, e.g. ``-kv2``), then the seed."""
    s = shape
    return (
        f"tiny-{family}-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
        f"-l{s.num_hidden_layers}-a{s.num_attention_heads}{sizes}-s{s.seed}"
    )
