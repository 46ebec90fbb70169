"""The vLLM releases the connector supports, each with the torch it is built against.

vLLM pins one torch per release; an engine runs only with that pair. ``moriio doctor`` and
the set-up scripts name these pairs; what differs between the releases is read in one place,
:mod:`moriio.vllm_plugin.vllm_facts`.
"""

from __future__ import annotations

VLLM_TORCH_PAIRS: dict[str, str] = {"0.32.0": "2.13.0", "0.33.0": "2.14.0"}
"""vLLM release -> the torch release it pins."""


def release_of(version: str) -> str:
    """``"0.33.0+cpu"`` -> ``"0.33.0"``: the release a build's version names."""
    return version.split("+", 1)[0]


def supported_releases() -> str:
    """``"0.32.0 (torch 2.13.0), 0.33.0 (torch 2.14.0)"``."""
    return ", ".join(f"{v} (torch {t})" for v, t in VLLM_TORCH_PAIRS.items())
