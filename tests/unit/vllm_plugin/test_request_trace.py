"""The connector's timeline events: by side, keyed by transfer id, forgotten at the last."""

from __future__ import annotations

from pathlib import Path

from moriio.domain.params.orders import HoldOrder, ReadOrder, SaveOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint, parse_transfer_params
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.timeline import TIMELINE_DIR_ENV, Timeline, read_events
from moriio.vllm_plugin.tracing import RequestTrace

PEER = PeerEndpoint("127.0.0.1", 6301, 61005)


def _events(path: Path) -> list[tuple[str, str]]:
    return [(e["ev"], e["id"]) for e in read_events(path)]


def test_decode_and_prefill_sides_are_named_by_their_params(tmp_path: Path) -> None:
    trace = RequestTrace(Timeline(str(tmp_path), "engine"))
    decode = parse_transfer_params(
        {
            "do_remote_prefill": True,
            "transfer_id": "t-d",
            "remote_block_ids": [1],
            "remote_host": "127.0.0.1",
            "remote_handshake_port": 6301,
            "remote_notify_port": 61005,
            "remote_engine_id": "e",
        },
        "r-d",
        producer_peer=False,
        consumer=True,
    )
    prefill = parse_transfer_params(
        {"do_remote_decode": True, "transfer_id": "t-p"}, "r-p", producer_peer=False, consumer=False
    )
    assert decode is not None
    assert prefill is not None
    trace.arrived("r-d", decode)
    trace.arrived("r-p", prefill)
    trace.events(["r-d", "r-p", "r-unknown"], "scheduled")
    trace.event("r-d", "finished", last=True)
    trace.event("r-d", "finished")  # forgotten: not recorded again
    assert _events(tmp_path) == [
        ("decode.arrived", "t-d"),
        ("prefill.arrived", "t-p"),
        ("decode.scheduled", "t-d"),
        ("prefill.scheduled", "t-p"),
        ("decode.finished", "t-d"),
    ]


def test_worker_orders_start_their_events(tmp_path: Path) -> None:
    trace = RequestTrace(Timeline(str(tmp_path), "worker"))
    orders = StepOrders(
        reads=[signed_read(ReadOrder("r-1", "t-1", (1,), (2,), PEER, None))],
        saves=[SaveOrder("r-2", "t-2", ((3,),), PEER, prompt=PROMPT)],
        holds=[HoldOrder("r-3", "t-3")],
    )
    trace.orders(orders)
    trace.events({"r-1"}, "landed", last=True)
    trace.events({"r-2", "r-3"}, "sent", last=True)
    assert sorted(_events(tmp_path)) == sorted(
        [
            ("decode.posted", "t-1"),
            ("prefill.push_ordered", "t-2"),
            ("decode.landed", "t-1"),
            ("prefill.sent", "t-2"),
            ("prefill.sent", "t-3"),
        ]
    )


def test_no_trace_without_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(TIMELINE_DIR_ENV, raising=False)
    assert RequestTrace.from_env("engine-scheduler") is None
