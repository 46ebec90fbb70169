"""The request side of a ZMQ control channel: one DEALER per peer, used under that peer's lock.

At most ``max_sockets`` request sockets stay open; dialling another peer closes the least
recently used idle one. A socket whose request timed out or failed is discarded, so a late
reply can never be mistaken for the answer to a later request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Generic

import zmq

from moriio.adapters.zmq import framing
from moriio.adapters.zmq.framing import Envelope, FrameLimits, FrameRejectedError, Kind, Reason
from moriio.adapters.zmq.sockets import Rejections, connect_dealer, recv_parts
from moriio.ports import (
    ControlChannelError,
    MalformedMessageError,
    MessageCodec,
    PeerAddress,
    RequestTimeoutError,
)
from moriio.ports.control_channel import MsgT

POLL_SLICE_S: Final = 0.05


class RequestSockets(Generic[MsgT]):
    """Per-peer request sockets and locks of one channel, bounded in number."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        codec: MessageCodec[MsgT],
        *,
        secret: bytes | None,
        limits: FrameLimits,
        transport_cap: int,
        send_hwm: int,
        max_sockets: int,
        rejections: Rejections,
        on_evict: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        self._codec = codec
        self._secret = secret
        self._limits = limits
        self._transport_cap = transport_cap
        self._send_hwm = send_hwm
        self._max_sockets = max_sockets
        self._rejections = rejections
        self._on_evict = on_evict
        self._sockets: OrderedDict[PeerAddress, zmq.Socket[bytes]] = OrderedDict()
        self._locks: dict[PeerAddress, threading.Lock] = {}
        self._guard = threading.Lock()

    @property
    def peers(self) -> frozenset[PeerAddress]:
        """Peers with an open request socket."""
        with self._guard:
            return frozenset(self._sockets)

    def lock(self, peer: PeerAddress) -> threading.Lock:
        """The lock every use of ``peer``'s request socket holds."""
        with self._guard:
            lock = self._locks.get(peer)
            if lock is None:
                lock = self._locks[peer] = threading.Lock()
            return lock

    def discard(self, peer: PeerAddress) -> None:
        """Close ``peer``'s request socket (its lock held)."""
        with self._guard:
            sock = self._sockets.pop(peer, None)
        if sock is not None:
            sock.close(linger=0)

    def close_all(self) -> None:
        """Close every request socket, waiting for requests in progress."""
        with self._guard:
            locks = list(self._locks.items())
        for peer, lock in locks:
            with lock:
                self.discard(peer)

    def exchange(
        self,
        peer: PeerAddress,
        frames: list[bytes],
        correlation: int,
        deadline: float,
        timeout: float,
        check_open: Callable[[], None],
    ) -> MsgT:
        """One request on ``peer``'s socket (its lock held) and its reply."""
        check_open()
        sock = self._socket(peer)
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.discard(peer)
            raise ControlChannelError(f"request queue to {peer} is full") from None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.discard(peer)
                raise RequestTimeoutError(f"no reply from {peer} within {timeout:g} s")
            check_open()
            if not sock.poll(int(min(remaining, POLL_SLICE_S) * 1000) + 1, zmq.POLLIN):
                continue
            reply = self._read_reply(sock, peer, correlation)
            if reply is not None:
                return self._decode_reply(reply, peer)

    def _socket(self, peer: PeerAddress) -> zmq.Socket[bytes]:
        """``peer``'s request socket (its lock held), opened on first use; the least recently
        used idle sockets are closed to stay within ``max_sockets``."""
        with self._guard:
            sock = self._sockets.get(peer)
            if sock is not None:
                self._sockets.move_to_end(peer)
                return sock
            for other in list(self._sockets):
                if len(self._sockets) < self._max_sockets:
                    break
                lock = self._locks.get(other)
                if lock is None or not lock.acquire(blocking=False):
                    continue  # in use: a request is running on it
                try:
                    self._sockets.pop(other).close(linger=0)
                finally:
                    lock.release()
                self._on_evict()
        try:
            sock = connect_dealer(self._ctx, peer, self._transport_cap, self._send_hwm)
        except zmq.ZMQError as exc:
            raise ControlChannelError(f"cannot connect to {peer}: {exc}") from exc
        with self._guard:
            self._sockets[peer] = sock
        return sock

    def _read_reply(
        self, sock: zmq.Socket[bytes], peer: PeerAddress, correlation: int
    ) -> Envelope | None:
        kept, total = recv_parts(sock)
        try:
            if total > 2:
                raise FrameRejectedError(Reason.BAD_FRAMES, f"{total} frames, expected 1 or 2")
            envelope = framing.decode([f.bytes for f in kept], self._secret, self._limits)
        except FrameRejectedError as exc:
            self._rejections.add(exc.reason, exc.detail, peer=str(peer))
            return None
        if envelope.kind not in (Kind.REPLY, Kind.ERROR) or envelope.correlation != correlation:
            self._rejections.add(
                Reason.STALE_REPLY,
                f"kind {envelope.kind.name} correlation {envelope.correlation}, "
                f"awaiting {correlation}",
                peer=str(peer),
            )
            return None
        return envelope

    def _decode_reply(self, envelope: Envelope, peer: PeerAddress) -> MsgT:
        if envelope.kind is Kind.ERROR:
            raise ControlChannelError(f"peer {peer} could not answer: {envelope.body}")
        try:
            return self._codec.decode(envelope.body)
        except MalformedMessageError as exc:
            self._rejections.add(Reason.INVALID_MESSAGE, str(exc), peer=str(peer))
            raise ControlChannelError(f"malformed reply from {peer}: {exc}") from exc
