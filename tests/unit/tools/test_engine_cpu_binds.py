"""Co-located engines get disjoint cores, or none is bound."""

from __future__ import annotations

import pytest

from moriio.tools.serve import processes
from moriio.tools.serve.processes import engine_cpu_binds


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    return monkeypatch


def _with_cores(monkeypatch: pytest.MonkeyPatch, ids: set[int]) -> None:
    monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid: ids)


def test_two_engines_on_two_cores_get_one_core_each(cores: pytest.MonkeyPatch) -> None:
    _with_cores(cores, {0, 1})
    assert engine_cpu_binds(2) == ["0", "1"]


def test_the_cores_this_process_may_use_are_shared_evenly(cores: pytest.MonkeyPatch) -> None:
    _with_cores(cores, {2, 3, 5, 7, 8})
    assert engine_cpu_binds(2) == ["2,3", "5,7"]


def test_more_engines_than_cores_bind_none(cores: pytest.MonkeyPatch) -> None:
    _with_cores(cores, {0, 1})
    assert engine_cpu_binds(4) == ["nobind"] * 4


def test_the_environment_wins_for_every_engine(cores: pytest.MonkeyPatch) -> None:
    _with_cores(cores, {0, 1})
    cores.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert engine_cpu_binds(2) == ["auto", "auto"]
