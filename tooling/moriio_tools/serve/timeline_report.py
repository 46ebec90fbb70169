"""``moriio bench --e2e --explain``: where a P/D request's time goes, stage by stage.

Joins the client's own times with the router's and both engines' timelines
(:mod:`moriio.timeline`): the router names the client's ``X-Request-Id`` in its
``router.received`` event, every other event carries the transfer id. Each stage is the
time between two events of one request; the table gives its p50 and p90 over the requests
of a case. The stages of one mode's critical path add up to about the client's TTFT.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moriio_tools.serve.client import Completion

Stage = tuple[str, str, str]  # what it is, from event, to event

_TAIL: tuple[Stage, ...] = (
    ("decode scheduled -> router's first chunk", "decode.scheduled", "router.first_chunk"),
    ("router's first chunk -> client's first token", "router.first_chunk", "client.first_token"),
)
_PREFILL: tuple[Stage, ...] = (
    ("client -> router", "client.sent", "router.received"),
    ("router -> prefill engine", "router.received", "prefill.arrived"),
    ("prefill: arrived -> scheduled", "prefill.arrived", "prefill.scheduled"),
)
_READ_PREFILL: tuple[Stage, ...] = (
    *_PREFILL,
    ("prefill: scheduled -> finished", "prefill.scheduled", "prefill.finished"),
    ("prefill finished -> router has its answer", "prefill.finished", "router.prefill_answered"),
    ("router -> decode engine", "router.prefill_answered", "decode.arrived"),
)
READ_PATH: tuple[Stage, ...] = (
    *_READ_PREFILL,
    ("decode: arrived -> reads posted", "decode.arrived", "decode.posted"),
    ("reads posted -> landed (reported)", "decode.posted", "decode.landed"),
    ("landed -> decode scheduled", "decode.landed", "decode.scheduled"),
    *_TAIL,
)
LAYERWISE_PATH: tuple[Stage, ...] = (
    *_READ_PREFILL,
    ("decode: arrived -> scheduled", "decode.arrived", "decode.scheduled"),
    ("decode scheduled -> reads posted", "decode.scheduled", "decode.posted"),
    # The forward waits for the reads layer by layer: no landed event, no extra step.
    ("reads posted -> router's first chunk", "decode.posted", "router.first_chunk"),
    _TAIL[1],
)
# ``--first-token-ahead``: the client's first token leaves with the prefill's answer; the
# decode's path (router -> decode -> its first chunk) runs beside it.
READ_AHEAD_PATH: tuple[Stage, ...] = (
    *_PREFILL,
    _READ_PREFILL[3],
    _READ_PREFILL[4],
    ("router has the answer -> first token sent ahead", "router.prefill_answered", "router.ahead"),
    ("first token sent ahead -> client's first token", "router.ahead", "client.first_token"),
)
AHEAD_SIDE: tuple[Stage, ...] = (
    ("off the path: router -> decode engine", "router.prefill_answered", "decode.arrived"),
    ("off the path: decode arrived -> landed", "decode.arrived", "decode.landed"),
    ("off the path: landed -> decode's first chunk", "decode.landed", "router.first_chunk"),
    ("off the path: sent ahead -> decode's first chunk", "router.ahead", "router.first_chunk"),
)
# WRITE ahead: the token goes once the prefill's answer is back, if before the decode's.
WRITE_AHEAD_PATH: tuple[Stage, ...] = (
    *_PREFILL,
    _READ_PREFILL[3],
    ("prefill finished -> first token sent ahead", "prefill.finished", "router.ahead"),
    READ_AHEAD_PATH[-1],
)
WRITE_AHEAD_SIDE: tuple[Stage, ...] = (
    ("off the path: prefill scheduled -> push done", "prefill.scheduled", "decode.landed"),
    ("off the path: landed -> decode's first chunk", "decode.landed", "router.first_chunk"),
    AHEAD_SIDE[-1],
)
WRITE_PATH: tuple[Stage, ...] = (
    *_PREFILL,
    ("prefill scheduled -> push done on decode", "prefill.scheduled", "decode.landed"),
    ("landed -> decode scheduled", "decode.landed", "decode.scheduled"),
    *_TAIL,
)
SIDE: tuple[Stage, ...] = (
    ("client: TTFT", "client.sent", "client.first_token"),
    ("router: first -> last chunk", "router.first_chunk", "router.done"),
    ("client: first -> last token", "client.first_token", "client.last_token"),
)
WRITE_SIDE: tuple[Stage, ...] = (
    ("off the path: router -> decode engine", "router.received", "decode.arrived"),
    ("off the path: decode arrived -> blocks announced", "decode.arrived", "decode.announced"),
)


@dataclass(frozen=True, slots=True)
class StageFigure:
    label: str
    count: int
    p50_ms: float
    p90_ms: float


def request_times(
    events: Iterable[Mapping[str, Any]], completions: Sequence[Completion]
) -> list[dict[str, float]]:
    """Per answered request of ``completions``: its first time of every event."""
    by_transfer: dict[str, dict[str, float]] = {}
    transfer_of: dict[str, str] = {}
    for event in events:
        name, transfer_id, at = str(event["ev"]), str(event["id"]), float(event["t"])
        times = by_transfer.setdefault(transfer_id, {})
        times[name] = min(at, times.get(name, at))
        if name == "router.received" and event.get("client"):
            transfer_of[str(event["client"])] = transfer_id
    out = []
    for completion in completions:
        known = transfer_of.get(completion.request_id)
        if known is None or not completion.token_walls or completion.error:
            continue
        times = dict(by_transfer[known])
        times["client.sent"] = completion.sent_wall
        times["client.first_token"] = completion.token_walls[0]
        times["client.last_token"] = completion.token_walls[-1]
        out.append(times)
    return out


def explain(requests: Sequence[Mapping[str, float]], stages: Sequence[Stage]) -> list[StageFigure]:
    """p50/p90 of each stage over the requests that recorded both of its events."""
    figures = []
    for label, start, end in stages:
        spans = sorted(r[end] - r[start] for r in requests if start in r and end in r)
        if spans:
            p90 = spans[min(len(spans) - 1, int(0.9 * len(spans)))]
            figures.append(
                StageFigure(label, len(spans), statistics.median(spans) * 1e3, p90 * 1e3)
            )
    return figures


def stages_for(connector: str, ahead: bool = False) -> tuple[Stage, ...]:
    """The critical path of ``connector``'s mode, then the figures beside it; ``ahead``: the
    router sent READ's first token ahead (``--first-token-ahead``)."""
    if connector.endswith("write"):
        if ahead:
            return WRITE_AHEAD_PATH + SIDE + WRITE_AHEAD_SIDE
        return WRITE_PATH + SIDE + WRITE_SIDE
    if ahead:
        return READ_AHEAD_PATH + SIDE + AHEAD_SIDE
    return (LAYERWISE_PATH if connector.endswith("layerwise") else READ_PATH) + SIDE


def render_explain(title: str, figures: Sequence[StageFigure]) -> str:
    """One table: stage, requests, p50 and p90 in ms."""
    width = max([len(f.label) for f in figures] + [5])
    lines = [title, f"  {'stage':<{width}}  {'n':>4}  {'p50 ms':>8}  {'p90 ms':>8}"]
    lines += [
        f"  {f.label:<{width}}  {f.count:>4}  {f.p50_ms:>8.2f}  {f.p90_ms:>8.2f}" for f in figures
    ]
    return "\n".join(lines)
