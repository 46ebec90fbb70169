"""The tools' model zoo: tiny seeded-random models of several families, by name.

Each family's shape is a module here (:mod:`~moriio.tools.models.llama`, ...);
:func:`moriio.tools.models.store.ensure_model` writes a model's files once and reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio.tools.models.deepseek_v2 import TinyDeepseekV2
from moriio.tools.models.gemma2 import TinyGemma2
from moriio.tools.models.llama import TinyLlama
from moriio.tools.models.qwen3 import TinyQwen3
from moriio.tools.models.store import ModelSpec


@dataclass(frozen=True, slots=True)
class ZooModel:
    """A model, the ``vllm serve`` flags every engine serving it needs, whether a request's
    output is the same whatever it is batched with, and whether a P/D deployment reproduces
    a single engine's outputs (else the reference is vLLM's own NixlConnector)."""

    name: str
    spec: ModelSpec
    engine_args: tuple[str, ...] = ()
    batch_invariant: bool = True
    single_engine_reference: bool = True


_MODELS = {
    "llama": ZooModel("llama", TinyLlama()),
    # vLLM's CPU MLA backend only runs 16-token blocks (the demo's default is 32), its
    # outputs change with what else is in the batch (requests have to be served alone), and
    # a P/D deployment answers differently from one engine, with vLLM's NixlConnector
    # exactly as with moriio.
    "deepseek-v2": ZooModel(
        "deepseek-v2",
        TinyDeepseekV2(),
        ("--block-size", "16"),
        batch_invariant=False,
        single_engine_reference=False,
    ),
    "qwen3": ZooModel("qwen3", TinyQwen3()),
    "gemma2": ZooModel("gemma2", TinyGemma2()),
}
MODEL_NAMES = tuple(_MODELS)
DEFAULT_MODEL = "llama"


def zoo_model(name: str) -> ZooModel:
    """The model called ``name`` (one of :data:`MODEL_NAMES`)."""
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, got {name!r}") from None
