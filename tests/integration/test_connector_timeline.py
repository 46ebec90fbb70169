"""Timelines through vLLM's real scheduler: every P/D request records its path, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from moriio.timeline import TIMELINE_DIR_ENV, read_events
from support.pd.sim_proxy import build_pd
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

PREFILL = ("prefill.arrived", "prefill.scheduled", "prefill.finished", "prefill.freed")
READ_DECODE = (
    "decode.arrived",
    "decode.posted",
    "decode.landed",
    "decode.ready",
    "decode.scheduled",
    "decode.finished",
)
WRITE_DECODE = (
    "decode.arrived",
    "decode.announced",
    "decode.landed",
    "decode.ready",
    "decode.scheduled",
    "decode.finished",
)


@pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
def test_each_request_records_its_path_in_order(
    read_mode: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMELINE_DIR_ENV, str(tmp_path))
    proxy = build_pd(InMemoryWorld(), read_mode)
    try:
        tids = [proxy.submit(str(i), list(range(1, 40 + i)), 3) for i in range(4)]
        proxy.run()
        assert len(proxy.done) == 4
    finally:
        proxy.close()
    by_transfer: dict[str, list[str]] = {}
    for event in sorted(read_events(tmp_path), key=lambda e: e["t"]):
        by_transfer.setdefault(event["id"], []).append(event["ev"])
    for tid in tids:
        seen = by_transfer[tid]
        at = {ev: i for i, ev in reversed(list(enumerate(seen)))}  # first occurrence
        assert [ev for ev in seen if ev in PREFILL] == list(PREFILL), seen
        decode = READ_DECODE if read_mode else WRITE_DECODE
        assert [ev for ev in seen if ev in decode] == list(decode), seen
        if read_mode:  # the decode reads what the finished prefill holds
            assert at["prefill.finished"] < at["decode.posted"] < at["prefill.freed"], seen
        else:  # the push is ordered in the prefill's step and lands after
            assert at["prefill.scheduled"] < at["prefill.push_ordered"] < at["decode.landed"]
