"""The tools' model zoo: tiny seeded-random models of several families, by name.

Each family's shape is a module here (:mod:`~moriio_tools.models.llama`, ...);
:func:`moriio_tools.models.store.ensure_model` writes a model's files once and reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.deepseek_v2 import TinyDeepseekV2
from moriio_tools.models.gemma2 import TinyGemma2
from moriio_tools.models.llama import TinyLlama
from moriio_tools.models.qwen3 import TinyQwen3
from moriio_tools.models.qwen3_next import TinyQwen3Next
from moriio_tools.models.store import ModelSpec


@dataclass(frozen=True, slots=True)
class ZooModel:
    """A model, the ``vllm serve`` flags every engine serving it needs, whether a request's
    output is the same whatever it is batched with, whether a P/D deployment reproduces
    a single engine's outputs (else the reference is vLLM's own NixlConnector), and whether
    it keeps recurrent state (a decode then computes each prompt's last token itself)."""

    name: str
    spec: ModelSpec
    engine_args: tuple[str, ...] = ()
    batch_invariant: bool = True
    single_engine_reference: bool = True
    recurrent_state: bool = False


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
    # vLLM's CPU Gated-DeltaNet kernels only run bfloat16 (the tools start engines in
    # float32), and vLLM raises the attention block to hold a linear-attention layer's state
    # (its recurrent state is float32 on CPUs with AVX512-BF16, bfloat16 elsewhere): 64-token
    # blocks hold it either way, so every engine gets the same block size on any host. A
    # P/D deployment loads the state as it stood before the last prompt token, which the
    # decode then feeds on its own: vLLM's NixlConnector answers 3 of 8 test prompts
    # differently from one engine exactly as moriio does (bfloat16 kernels split at another
    # token), so the reference is vLLM's NixlConnector 1P1D.
    "qwen3-next": ZooModel(
        "qwen3-next",
        TinyQwen3Next(),
        ("--dtype", "bfloat16", "--block-size", "64"),
        single_engine_reference=False,
        recurrent_state=True,
    ),
}
MODEL_NAMES = tuple(_MODELS)
DEFAULT_MODEL = "llama"


def zoo_model(name: str) -> ZooModel:
    """The model called ``name`` (one of :data:`MODEL_NAMES`)."""
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, got {name!r}") from None
