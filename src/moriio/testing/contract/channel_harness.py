"""What the ControlChannel contract needs from a channel kind: build connected channels."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from moriio.ports import ControlChannel, MalformedMessageError, MessageCodec
from moriio.ports.control_channel import MsgT
from moriio.testing.inmemory import FakeClock, InMemoryControlChannel, InMemoryNetwork

HOST = "127.0.0.1"
OTHER_HOST = "127.0.0.2"  # a second loopback host, trusted by nobody at first
Msg = dict[str, Any]


class PingCodec:
    """Test codec: dict messages with a known ``"type"`` (ping or hello) and an int ``"seq"``."""

    def encode(self, message: Msg) -> Mapping[str, Any]:
        return message

    def decode(self, raw: object) -> Msg:
        if not isinstance(raw, dict):
            raise MalformedMessageError("not_a_map", type(raw).__name__)
        if raw.get("type") not in {"ping", "hello"}:
            raise MalformedMessageError("unknown_type", repr(raw.get("type")))
        if not isinstance(raw.get("seq"), int):
            raise MalformedMessageError("bad_field", "seq must be an int")
        return dict(raw)


def ping(seq: int, **extra: Any) -> Msg:
    """A ping message :class:`PingCodec` accepts."""
    return {"type": "ping", "seq": seq, **extra}


class CountingChannel(ControlChannel[MsgT], Protocol[MsgT]):
    """A ControlChannel that also counts the inbound messages it rejected, by reason."""

    @property
    def rejected(self) -> Mapping[str, int]: ...

    @property
    def listener_alive(self) -> bool: ...


class ChannelHarness:
    """Builds channels of one kind that reach each other; closes them at the end.

    Subclasses implement :meth:`create`: a channel with ``codec`` listening on ``host:port``
    (port 0: any free port); ``options`` are ``trusted_hosts``, ``inbox_limit`` and
    ``max_frame_bytes``, as both channels of this package take them.
    """

    kind = ""

    def __init__(self) -> None:
        self.channels: list[ControlChannel[Any]] = []

    def create(
        self, codec: MessageCodec[MsgT], host: str, port: int, **options: Any
    ) -> CountingChannel[MsgT]:
        raise NotImplementedError

    def open(
        self, codec: MessageCodec[MsgT], host: str = HOST, port: int = 0, **options: Any
    ) -> CountingChannel[MsgT]:
        """A new channel, closed with the harness."""
        channel = self.create(codec, host, port, **options)
        self.channels.append(channel)
        return channel

    def channel(self, host: str = HOST, **options: Any) -> CountingChannel[Msg]:
        """A new channel speaking :class:`PingCodec`."""
        return self.open(PingCodec(), host, **options)

    def close(self) -> None:
        for channel in reversed(self.channels):
            channel.close()


def receive(channel: ControlChannel[MsgT], count: int, timeout: float = 10.0) -> list[MsgT]:
    """Drain until ``count`` messages arrived or ``timeout`` seconds passed."""
    got: list[MsgT] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got.extend(inbound.message for inbound in channel.drain(timeout=0.05))
    return got


def eventually(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait until ``predicate`` holds (a listener thread may still be at work)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:g} s")
        time.sleep(0.01)


class InMemoryChannelHarness(ChannelHarness):
    """In-memory channels on one network with a fake clock (timeouts take no real time)."""

    kind = "inmemory"

    def __init__(self) -> None:
        super().__init__()
        self.network = InMemoryNetwork(FakeClock())

    def create(
        self, codec: MessageCodec[MsgT], host: str, port: int, **options: Any
    ) -> CountingChannel[MsgT]:
        return InMemoryControlChannel(self.network, codec, host, port, **options)
