"""``--explain``: client, router and engine events joined per request, stages as p50/p90."""

from __future__ import annotations

import pytest

from moriio_tools.serve.client import Completion
from moriio_tools.serve.timeline_report import (
    LAYERWISE_PATH,
    READ_PATH,
    WRITE_PATH,
    explain,
    render_explain,
    request_times,
    stages_for,
)


def _events(transfer_id: str, client: str, start: float) -> list[dict[str, object]]:
    offsets = {
        "router.received": 0.001,
        "prefill.arrived": 0.003,
        "prefill.scheduled": 0.004,
        "prefill.finished": 0.020,
        "router.prefill_answered": 0.023,
        "decode.arrived": 0.026,
        "decode.posted": 0.027,
        "decode.landed": 0.028,
        "decode.scheduled": 0.031,
        "router.first_chunk": 0.036,
    }
    out: list[dict[str, object]] = [
        {"t": start + dt, "ev": ev, "id": transfer_id} for ev, dt in offsets.items()
    ]
    out[0]["client"] = client
    out.append({"t": start + 0.040, "ev": "decode.scheduled", "id": transfer_id})  # later: ignored
    return out


def _completion(request_id: str, start: float, error: str | None = None) -> Completion:
    return Completion(
        0, request_id=request_id, sent_wall=start, token_walls=[start + 0.037], error=error
    )


def test_read_stages_add_up_to_the_client_ttft() -> None:
    events = _events("t-1", "c-1", 100.0) + _events("t-2", "c-2", 200.0)
    events.append({"t": 300.0, "ev": "router.received", "id": "t-3", "client": "other"})
    completions = [_completion("c-1", 100.0), _completion("c-2", 200.0)]
    times = request_times(events, completions)
    figures = {f.label: f for f in explain(times, READ_PATH)}
    assert len(times) == 2
    assert figures["reads posted -> landed (reported)"].p50_ms == pytest.approx(1.0)
    assert figures["landed -> decode scheduled"].p50_ms == pytest.approx(3.0)  # first one
    assert figures["router -> decode engine"].count == 2
    assert sum(f.p50_ms for f in figures.values()) == pytest.approx(37.0)


def test_failed_or_unknown_requests_are_left_out() -> None:
    events = _events("t-1", "c-1", 100.0)
    completions = [_completion("c-1", 100.0, error="HTTP 500"), _completion("c-9", 100.0)]
    assert request_times(events, completions) == []


def test_stages_without_both_events_are_not_shown() -> None:
    times = request_times(_events("t-1", "c-1", 0.0), [_completion("c-1", 0.0)])
    labels = [f.label for f in explain(times, WRITE_PATH)]
    assert "prefill scheduled -> push done on decode" in labels
    assert "off the path: decode arrived -> blocks announced" not in labels


def test_the_path_follows_the_mode_and_renders() -> None:
    assert stages_for("moriio-write")[: len(WRITE_PATH)] == WRITE_PATH
    assert stages_for("moriio-read-async")[: len(READ_PATH)] == READ_PATH
    assert stages_for("moriio-read-layerwise")[: len(LAYERWISE_PATH)] == LAYERWISE_PATH
    times = request_times(_events("t-1", "c-1", 0.0), [_completion("c-1", 0.0)])
    text = render_explain("title", explain(times, READ_PATH))
    assert text.splitlines()[0] == "title"
    assert "client -> router" in text
    assert "1.00" in text
