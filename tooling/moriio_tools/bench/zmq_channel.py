"""Control-channel latency benchmark on loopback: request/reply and send+drain ping-pong."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq

from moriio.adapters.zmq.channel import ZmqControlChannel
from moriio.ports import MalformedMessageError

Ping = dict[str, int]


class _PingCodec:
    """A minimal codec: ``{"seq": int}`` messages."""

    def encode(self, message: Ping) -> Mapping[str, Any]:
        return message

    def decode(self, raw: object) -> Ping:
        if not isinstance(raw, dict) or set(raw) != {"seq"} or not isinstance(raw["seq"], int):
            raise MalformedMessageError("bad_ping", repr(raw)[:80])
        return {"seq": raw["seq"]}


def _summary(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        rank = max(0, math.ceil(q * len(ordered)) - 1)
        return ordered[rank] / 1000.0

    return {
        "samples": float(len(ordered)),
        "p50_us": pick(0.50),
        "p99_us": pick(0.99),
        "mean_us": sum(ordered) / len(ordered) / 1000.0,
        "max_us": ordered[-1] / 1000.0,
    }


def _request_reply(
    client: ZmqControlChannel[Ping], server: ZmqControlChannel[Ping], samples: int, warmup: int
) -> list[int]:
    server.serve(lambda message: message)
    timings: list[int] = []
    for seq in range(warmup + samples):
        start = time.perf_counter_ns()
        reply = client.request(server.address, {"seq": seq}, timeout=5.0)
        elapsed = time.perf_counter_ns() - start
        if reply["seq"] != seq:
            raise RuntimeError(f"reply {reply} does not match request {seq}")
        if seq >= warmup:
            timings.append(elapsed)
    return timings


def _echo(server: ZmqControlChannel[Ping], stop: threading.Event) -> None:
    while not stop.is_set():
        for inbound in server.drain(timeout=0.05):
            if inbound.sender is not None:
                server.send(inbound.sender, inbound.message)


def _ping_pong(
    client: ZmqControlChannel[Ping], server: ZmqControlChannel[Ping], samples: int, warmup: int
) -> list[int]:
    stop = threading.Event()
    echo = threading.Thread(target=_echo, args=(server, stop), name="bench-echo", daemon=True)
    echo.start()
    timings: list[int] = []
    try:
        for seq in range(warmup + samples):
            start = time.perf_counter_ns()
            client.send(server.address, {"seq": seq})
            deadline = time.monotonic() + 5.0
            while not any(i.message["seq"] == seq for i in client.drain(timeout=1.0)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ping {seq} was not echoed within 5 s")
            elapsed = time.perf_counter_ns() - start
            if seq >= warmup:
                timings.append(elapsed)
    finally:
        stop.set()
        echo.join()
    return timings


def _raw_echo(router: zmq.Socket[bytes], stop: threading.Event) -> None:
    while not stop.is_set():
        if router.poll(50, zmq.POLLIN):
            router.send_multipart(router.recv_multipart())


def _raw_zmq(host: str, samples: int, warmup: int) -> list[int]:
    """Reference: a bare DEALER/ROUTER echo on one context, no framing or validation."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stop = threading.Event()
    try:
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port(f"tcp://{host}")
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://{host}:{port}")
        echo = threading.Thread(target=_raw_echo, args=(router, stop), daemon=True)
        echo.start()
        timings: list[int] = []
        payload = b"\x81\xa3seq\x00" * 8
        for seq in range(warmup + samples):
            start = time.perf_counter_ns()
            dealer.send(payload)
            if not dealer.poll(5000, zmq.POLLIN):
                raise RuntimeError("raw echo did not answer within 5 s")
            dealer.recv()
            if seq >= warmup:
                timings.append(time.perf_counter_ns() - start)
        stop.set()
        echo.join()
        return timings
    finally:
        stop.set()
        ctx.destroy(linger=0)


def run_control_benchmark(
    samples: int = 2000,
    warmup: int = 200,
    *,
    host: str = "127.0.0.1",
    secret: bytes | None = None,
) -> dict[str, Any]:
    """Round-trip latency of two channels on ``host``; microsecond percentiles per mode.

    ``raw_zmq`` is a bare DEALER/ROUTER echo measured in the same run, the floor the channel
    is compared against (``request_reply_vs_raw`` is the ratio of the p50s).
    """
    if samples < 1 or warmup < 0:
        raise ValueError(f"need samples >= 1 and warmup >= 0, got {samples}, {warmup}")
    codec = _PingCodec()
    server = ZmqControlChannel(codec, host, 0, secret=secret)
    client = ZmqControlChannel(codec, host, 0, secret=secret)
    try:
        request_reply = _request_reply(client, server, samples, warmup)
        ping_pong = _ping_pong(client, server, samples, warmup)
    finally:
        client.close()
        server.close()
    raw = _summary(_raw_zmq(host, samples, warmup))
    reply = _summary(request_reply)
    return {
        "hmac": secret is not None,
        "request_reply": reply,
        "send_drain": _summary(ping_pong),
        "raw_zmq": raw,
        "request_reply_vs_raw": reply["p50_us"] / raw["p50_us"],
    }
