"""Fixtures shared by the engine tests: reference outputs, computed once a session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from support.llama_reference import LlamaReference, llama_reference_outputs
from support.model_references import Reference, reference_getter


@pytest.fixture(scope="session")
def llama_reference(tmp_path_factory: pytest.TempPathFactory) -> LlamaReference:
    return llama_reference_outputs(tmp_path_factory.mktemp("baseline"))


@pytest.fixture(scope="session")
def model_references(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Reference]:
    """Each zoo model's directory, prompts and reference outputs (computed once per model)."""
    return reference_getter(lambda model: tmp_path_factory.mktemp(f"reference-{model}"))
