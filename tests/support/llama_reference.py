"""The default model's reference outputs, shared by the engine tests of one session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio_tools.harness import Prompt, ServeDemoConfig, baseline, build_prompts, prepare_model

# The default model's prompt sets the engine tests send, as (requests, seed) for
# build_prompts: one reference engine answers all of them once a session.
LLAMA_PROMPT_SETS = {
    "deployment": (19, 0),  # test_serve_deployment, and the first 8 for test_serve_hostile
    "cancel": (16, 7),  # test_serve_cancel: two waves of 8
    "crash-decode": (6, 11),  # test_serve_crash: the recovery wave after each victim's
    "crash-prefill": (6, 13),  # restart, prompts of its own
    "hosts": (4, 1),  # test_serve_hosts
    "tp": (4, 3),  # test_serve_tp
    "soak": (64, 0),  # test_soak: the soak's pool (SoakConfig's pool and seed)
}
Reference = tuple[Path, list[Prompt], list[Any]]


@dataclass(frozen=True)
class LlamaReference:
    """The default model's directory and a plain engine's output for every declared prompt."""

    model_dir: Path
    outputs: dict[Prompt, tuple[int, ...]]

    def prompt_set(self, name: str) -> Reference:
        """The named set's prompts (see :data:`LLAMA_PROMPT_SETS`) with their outputs."""
        requests, seed = LLAMA_PROMPT_SETS[name]
        prompts = build_prompts(requests, seed=seed)
        return self.model_dir, prompts, [self.outputs[p] for p in prompts]


def llama_reference_outputs(log_dir: Path) -> LlamaReference:
    """One plain engine's outputs for every prompt of every declared set."""
    config = ServeDemoConfig()
    model_dir = prepare_model(config)
    sets = [build_prompts(n, seed=seed) for n, seed in LLAMA_PROMPT_SETS.values()]
    prompts = list(dict.fromkeys(p for prompt_set in sets for p in prompt_set))
    expected = baseline(model_dir, prompts, config, log_dir)
    return LlamaReference(model_dir, dict(zip(prompts, expected, strict=True)))
