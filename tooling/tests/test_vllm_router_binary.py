"""vllm-router is found in the checkout's own ``.venv-router`` (where scripts/setup.sh puts it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moriio_tools.serve import processes
from moriio_tools.serve.processes import vllm_router_binary

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkouts_venv_router_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MORIIO_VLLM_ROUTER", raising=False)
    monkeypatch.setattr(processes.shutil, "which", lambda name: None)
    local = ROOT / ".venv-router" / "bin" / "vllm-router"
    expected = str(local) if local.is_file() else None
    assert vllm_router_binary() == expected


def test_the_project_root_is_where_the_tooling_lives() -> None:
    assert (ROOT / "tooling" / "moriio_tools" / "serve" / "processes.py").is_file()
    assert Path(processes.__file__).resolve().parents[3] == ROOT
