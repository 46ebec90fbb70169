"""Co-located engines get disjoint cores, or none is bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pytest_mock import MockerFixture

from moriio_tools.serve import processes
from moriio_tools.serve.processes import engine_cpu_binds


@pytest.fixture
def with_cores(
    mocker: MockerFixture, monkeypatch: pytest.MonkeyPatch
) -> Callable[[set[int]], None]:
    """No bind in the environment; the returned function sets the cores this process may use."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)

    def allow(ids: set[int]) -> None:
        mocker.patch.object(processes.os, "sched_getaffinity", return_value=ids)

    return allow


def test_two_engines_on_two_cores_get_one_core_each(with_cores: Callable[[set[int]], None]) -> None:
    with_cores({0, 1})
    assert engine_cpu_binds(2) == ["0", "1"]


def test_the_cores_this_process_may_use_are_shared_evenly(
    with_cores: Callable[[set[int]], None],
) -> None:
    with_cores({2, 3, 5, 7, 8})
    assert engine_cpu_binds(2) == ["2,3", "5,7"]


def test_more_engines_than_cores_bind_none(with_cores: Callable[[set[int]], None]) -> None:
    with_cores({0, 1})
    assert engine_cpu_binds(4) == ["nobind"] * 4


def test_the_environment_wins_for_every_engine(
    with_cores: Callable[[set[int]], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_cores({0, 1})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert engine_cpu_binds(2) == ["auto", "auto"]
