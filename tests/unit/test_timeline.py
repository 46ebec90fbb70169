"""Opt-in timelines: nothing written without a directory, whole lines from many threads."""

from __future__ import annotations

import threading
from pathlib import Path

from moriio.timeline import TIMELINE_DIR_ENV, Timeline, read_events


def test_without_a_directory_nothing_is_recorded(tmp_path: Path) -> None:
    timeline = Timeline(None, "router")
    timeline.record("router.received", "t-1")
    assert not timeline.enabled
    assert list(tmp_path.iterdir()) == []


def test_events_are_read_back_with_their_fields(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path), "router")
    timeline.record("router.received", "t-1", client="c-1")
    timeline.record("router.done", "t-1", chunks=3)
    timeline.close()
    events = list(read_events(tmp_path))
    assert [(e["ev"], e["id"]) for e in events] == [
        ("router.received", "t-1"),
        ("router.done", "t-1"),
    ]
    assert events[0]["client"] == "c-1"
    assert events[1]["chunks"] == 3
    assert events[0]["t"] <= events[1]["t"]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path), "engine")
    timeline.record("decode.posted", "t-1")
    timeline.close()
    (path,) = tmp_path.glob("*.jsonl")
    with path.open("a") as f:
        f.write('{"t": 1.0, "ev": "decode.lan')
    assert [e["ev"] for e in read_events(tmp_path)] == ["decode.posted"]


def test_lines_from_many_threads_stay_whole(tmp_path: Path) -> None:
    timeline = Timeline(str(tmp_path), "engine")

    def record(n: int) -> None:
        for i in range(200):
            timeline.record("decode.posted", f"t-{n}-{i}")

    threads = [threading.Thread(target=record, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    timeline.close()
    assert len({e["id"] for e in read_events(tmp_path)}) == 1600


def test_from_env_reads_the_directory(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(TIMELINE_DIR_ENV, str(tmp_path / "tl"))
    timeline = Timeline.from_env("router")
    assert timeline.enabled
    timeline.close()
    monkeypatch.delenv(TIMELINE_DIR_ENV)
    assert not Timeline.from_env("router").enabled
