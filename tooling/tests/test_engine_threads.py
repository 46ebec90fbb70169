"""Per-thread CPU, run-queue waits and wake-ups read from /proc, and summed per engine."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from moriio_tools.engines import threads
from moriio_tools.stepped.bindings import BINDINGS, inherited
from moriio_tools.stepped.usage import engine_usage


def _task(proc: Path, pid: int, tid: int, comm: str, run: int, wait: int, vol: int, inv: int):
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "schedstat").write_text(f"{run} {wait} 7\n")
    (task / "comm").write_text(f"{comm}\n")
    (task / "status").write_text(
        f"Name:\t{comm}\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t{vol}\n"
        f"nonvoluntary_ctxt_switches:\t{inv}\n"
    )


def test_usage_is_the_difference_per_thread_with_new_threads_counted_from_zero(
    tmp_path: Path,
) -> None:
    _task(tmp_path, 10, 10, "python", 1_000_000_000, 0, 5, 1)
    _task(tmp_path, 10, 11, "python", 100, 50, 40, 0)
    before = threads.sample(10, tmp_path)
    assert set(before) == {10, 11}
    assert before[11] == threads.ThreadCounters(11, "python", 100, 50, 40, 0)
    _task(tmp_path, 10, 10, "python", 1_500_000_000, 250_000_000, 7, 4)
    _task(tmp_path, 10, 11, "python", 20_000_100, 50, 240, 0)
    _task(tmp_path, 10, 12, "ZMQbg/IO/0", 1_000_000, 0, 30, 0)  # started in between
    after = threads.sample(10, tmp_path)
    rows = threads.usage(10, before, after, {11: "moriio-progress"})
    assert rows == [
        threads.ThreadUsage("main[10]", 0.5, 0.25, 2, 3),
        threads.ThreadUsage("moriio-progress[11]", 0.02, 0.0, 200, 0),
        threads.ThreadUsage("ZMQbg/IO/0[12]", 0.001, 0.0, 30, 0),
    ]
    process = threads.summarize(rows, 2.0)
    assert process.cpu == pytest.approx(0.2605)
    assert process.wakeups_per_s == pytest.approx(116.0)
    assert process.preempted_per_s == pytest.approx(1.5)


def test_a_process_that_ended_has_no_threads(tmp_path: Path) -> None:
    assert threads.sample(99, tmp_path) == {}


def test_this_process_is_read_from_the_real_proc() -> None:
    done = threading.Event()
    sleeper = threading.Thread(target=done.wait)
    sleeper.start()
    try:
        counters = threads.sample(os.getpid())
    finally:
        done.set()
        sleeper.join()
    assert os.getpid() in counters
    assert sleeper.native_id in counters
    assert counters[os.getpid()].run_ns > 0


def test_threads_of_one_name_are_summed_per_engine() -> None:
    rows = [
        threads.ThreadUsage("main[1]", 0.8, 0.1, 10, 5),
        threads.ThreadUsage("gloo_tcp_loop[2]", 0.01, 0.0, 100, 0),
        threads.ThreadUsage("gloo_tcp_loop[3]", 0.01, 0.0, 100, 1),
        threads.ThreadUsage("moriio-progress[4]", 0.0, 0.0, 1, 0),
    ]
    usage = engine_usage(rows, 2.0)
    assert [(g.name, g.count) for g in usage.groups] == [
        ("main", 1),
        ("gloo_tcp_loop", 2),
        ("moriio-progress", 1),
    ]
    assert usage.groups[1].wakeups_per_s == pytest.approx(100.0)
    assert usage.wakeups_per_s == pytest.approx(105.5)
    assert usage.as_dict()["threads"][2] == {
        "name": "moriio-progress",
        "count": 1,
        "cpu": 0.0,
        "wait": 0.0,
        "wakeups_per_s": 0.5,
        "preempted_per_s": 0.0,
    }


def test_each_binding_says_what_each_engine_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    engines = {name: binding.engines(2) for name, binding in BINDINGS.items()}
    assert [(e.cores, e.env) for e in engines["vllm-defaults"]] == [("nobind", {})] * 2
    assert [(e.cores, e.env) for e in engines["defaults-passive"]] == [
        ("nobind", {"OMP_WAIT_POLICY": "PASSIVE"})
    ] * 2
    assert [(e.cores, e.env) for e in engines["unbound-2"]] == [
        ("nobind", {"OMP_NUM_THREADS": "2"})
    ] * 2
    assert [(e.cores, e.env) for e in engines["unbound-1"]] == [
        ("nobind", {"OMP_NUM_THREADS": "1"})
    ] * 2
    assert [(e.cores, e.env) for e in engines["own-cores"]] == [("0", {}), ("1", {})]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert inherited() == {"OMP_NUM_THREADS": "4"}
