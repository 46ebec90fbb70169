"""The demo model: a tiny Llama with seeded random weights, written locally once.

vLLM's ``load_format="dummy"`` reseeds every parameter alike, so its outputs barely depend
on the KV cache; N(0, 0.1) weights from one seeded generator make every decoded token depend
on the context, which is what a KV-transfer check needs. The files (about 3.6 MB) live in a
cache directory outside any repository and are reused when present. Other families, written
the same way, are in :mod:`moriio.tools.pd.zoo`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import Field, asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

MODEL_FILES = ("config.json", "model.safetensors")


class ModelSpec(Protocol):
    """What :func:`ensure_model` needs of a tiny model's shape (a dataclass)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def vocab_size(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def std(self) -> float: ...
    @property
    def norm_weight(self) -> float: ...
    @property
    def dirname(self) -> str: ...
    def config(self) -> dict[str, object]: ...
    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]: ...


@dataclass(frozen=True, slots=True)
class TinyLlama:
    """Shape of the demo model (head_dim = hidden_size / num_attention_heads = 64)."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def norm_weight(self) -> float:
        """Every RMSNorm weight (Llama scales by the weight: 1 leaves the input as is)."""
        return 1.0

    @property
    def dirname(self) -> str:
        """A directory name that changes whenever the shape or the seed does."""
        s = self
        return (
            f"tiny-llama-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
            f"-l{s.num_hidden_layers}-a{s.num_attention_heads}-kv{s.num_key_value_heads}"
            f"-s{s.seed}"
        )

    def config(self) -> dict[str, object]:
        """The Hugging Face ``config.json`` content."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
            "dtype": "float32",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every weight in a fixed order (the order the generator draws them)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = self.num_key_value_heads * self.head_dim
        q = self.num_attention_heads * self.head_dim
        shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}"
            shapes += [
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.self_attn.q_proj.weight", (q, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)),
                (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, q)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
                (f"{p}.mlp.gate_proj.weight", (i, h)),
                (f"{p}.mlp.up_proj.weight", (i, h)),
                (f"{p}.mlp.down_proj.weight", (h, i)),
            ]
        shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
        return shapes


def default_cache_dir() -> Path:
    """``$MORIIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/moriio``, else ``~/.cache/moriio``."""
    explicit = os.environ.get("MORIIO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "moriio"


def _complete(path: Path) -> bool:
    return all((path / name).is_file() for name in MODEL_FILES)


def ensure_model(cache_dir: Path | None = None, spec: ModelSpec | None = None) -> Path:
    """The model directory, written (atomically) on first use and reused afterwards."""
    spec = spec or TinyLlama()
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / spec.dirname
    if _complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=root))
    try:
        _write(staging, spec)
        try:
            staging.rename(target)
        except OSError:
            if not _complete(target):  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write(directory: Path, spec: ModelSpec) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(spec.seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in spec.tensor_shapes():
        if name.endswith("norm.weight"):
            tensors[name] = torch.full(shape, spec.norm_weight, dtype=torch.float32)
        else:
            tensors[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * spec.std
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = spec.config()
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / "moriio-model.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
