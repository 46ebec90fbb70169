"""Fixtures shared by the engine tests: one plain engine's outputs, computed once a session."""

from __future__ import annotations

import pytest

from support.llama_reference import LlamaReference, llama_reference_outputs


@pytest.fixture(scope="session")
def llama_reference(tmp_path_factory: pytest.TempPathFactory) -> LlamaReference:
    return llama_reference_outputs(tmp_path_factory.mktemp("baseline"))
