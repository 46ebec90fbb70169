"""Tiny models' files (config and seeded random weights), written locally once and reused.

vLLM's ``load_format="dummy"`` reseeds every parameter alike, so its outputs barely depend
on the KV cache; N(0, 0.1) weights from one seeded generator make every decoded token depend
on the context, which is what a KV-transfer check needs. The files (about 3.6 MB for the
default :class:`~moriio_tools.models.llama.TinyLlama`) live in a cache directory outside any
repository and are reused when present.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import Field, asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

from moriio_tools.models.llama import TinyLlama
from moriio_tools.models.shapes import Shapes

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
    def tensor_shapes(self) -> Shapes: ...


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
