"""ControlChannel port: small typed messages between peers, plus a request/reply handshake.

The channel is generic over the message type it carries; a :class:`MessageCodec` turns
messages into plain wire values and validates what comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

MsgT = TypeVar("MsgT")


class ControlChannelError(RuntimeError):
    """Base class of control-plane errors."""


class UntrustedPeerError(ControlChannelError):
    """A send to a host that neither a handshake nor ``trusted_remote_hosts`` vouched for."""


class RequestTimeoutError(ControlChannelError):
    """A request got no reply within its deadline."""


class MalformedMessageError(ValueError):
    """A wire value that does not decode into a valid message; ``reason`` names the defect."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, order=True)
class PeerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Inbound(Generic[MsgT]):
    """A validated message and the address its sender said it listens on (if any)."""

    message: MsgT
    sender: PeerAddress | None = None


class MessageCodec(Protocol[MsgT]):
    """Converts messages to and from plain msgpack-able mappings."""

    def encode(self, message: MsgT) -> Mapping[str, Any]:
        """Plain mapping for the wire."""
        ...

    def decode(self, raw: object) -> MsgT:
        """Validate ``raw``; raise :class:`MalformedMessageError` naming what is wrong."""
        ...


class ControlChannel(Protocol[MsgT]):
    """Fire-and-forget messages plus a blocking request/reply used for handshakes."""

    @property
    def address(self) -> PeerAddress:
        """Where peers reach this channel."""
        ...

    def serve(self, responder: Callable[[MsgT], MsgT]) -> None:
        """Answer requests with ``responder`` (called on the listener thread)."""
        ...

    def trust(self, host: str) -> None:
        """Allow sends to ``host`` (learned through a handshake)."""
        ...

    def send(self, peer: PeerAddress, message: MsgT) -> None:
        """Queue ``message`` for ``peer`` without blocking on the peer.

        Raises :class:`UntrustedPeerError` before any socket is opened for an untrusted host.
        """
        ...

    def request(self, peer: PeerAddress, message: MsgT, timeout: float) -> MsgT:
        """Send ``message`` and wait up to ``timeout`` seconds for the reply."""
        ...

    def drain(self, timeout: float = 0.0) -> list[Inbound[MsgT]]:
        """Messages received since the last call; waits up to ``timeout`` for the first, or
        until :meth:`wake` is called."""
        ...

    def wake(self) -> None:
        """Make a :meth:`drain` that waits now return at once (or the next one, when none
        waits): another thread has work for the one that drains. Never raises, closed or
        not."""
        ...

    def is_listening(self, peer: PeerAddress, timeout: float) -> bool | None:
        """Whether a process listens at ``peer``: False when its host refused the connection
        (nothing is bound there: the process that was is gone), None when that is not known
        within ``timeout``. Raises :class:`UntrustedPeerError` as :meth:`send` does."""
        ...

    def close(self) -> None:
        """Stop the listener and close every socket."""
        ...
