"""Fixtures shared by the engine tests: one plain engine's outputs, computed once a session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moriio.tools.prompts import Prompt, build_prompts
from moriio.tools.serve.runner import ServeDemoConfig, baseline, prepare_model

# The default model's prompts several modules send (the first ones, or all), with the
# outputs of one plain engine: a reference engine started once, not once per module.
REFERENCE_PROMPTS = 19


@pytest.fixture(scope="session")
def llama_reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[Prompt], list[Any]]:
    config = ServeDemoConfig()
    model_dir = prepare_model(config)
    prompts = build_prompts(REFERENCE_PROMPTS, seed=0)
    expected = baseline(model_dir, prompts, config, tmp_path_factory.mktemp("baseline"))
    return model_dir, prompts, expected
