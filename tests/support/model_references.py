"""Each zoo model's prompts and reference outputs, computed once a session per model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from moriio_tools.harness import Prompt, ServeDemoConfig, build_prompts, prepare_model, reference

IDLE = 2  # requests sent one at a time
CONCURRENT = 6  # then all at once
Reference = tuple[Path, list[Prompt], list[tuple[int, ...]]]


def model_config(model: str, **changes: object) -> ServeDemoConfig:
    """The serve runs' configuration for ``model``: 8 requests, 2 of them one at a time."""
    config = ServeDemoConfig(model=model, requests=CONCURRENT, idle_requests=IDLE, idle_gap_s=1.0)
    return replace(config, **changes)  # type: ignore[arg-type]


def reference_getter(log_dirs: Callable[[str], Path]) -> Callable[[str], Reference]:
    """A getter of each model's directory, prompts and reference outputs (the model's
    reference: a plain engine, or vLLM's NixlConnector 1P1D), computed on first use."""
    cache: dict[str, Reference] = {}

    def get(model: str) -> Reference:
        if model not in cache:
            config = model_config(model)
            model_dir = prepare_model(config)
            prompts = build_prompts(IDLE + CONCURRENT, seed=0)
            expected = reference(model_dir, prompts, config, log_dirs(model))
            cache[model] = (model_dir, prompts, expected)
        return cache[model]

    return get
