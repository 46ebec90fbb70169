"""The listener thread of a ZMQ control channel: validates inbound frames, answers requests.

The ROUTER socket and the receiving end of a wake-up pipe belong to the listener thread
alone. Every message is handled inside its own ``try``; a failure is counted and logged, and
the loop goes on. The thread ends only when the channel stops it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic

import zmq
from structlog.typing import FilteringBoundLogger

from moriio.adapters.zmq import framing
from moriio.adapters.zmq.framing import (
    MAX_ERROR_CHARS,
    Envelope,
    FrameLimits,
    FrameRejectedError,
    Kind,
    Reason,
    ReplayGuard,
)
from moriio.adapters.zmq.sockets import Rejections, peer_of, recv_parts
from moriio.ports import Inbound, MalformedMessageError, MessageCodec, PeerAddress
from moriio.ports.control_channel import MsgT

# The codec's reason for a message of another protocol version (MalformedMessageError.reason).
UNSUPPORTED_VERSION = "unsupported_version"


class _Refused(str):
    """Why an inbound message was refused: the text an error reply carries."""


class Listener(Generic[MsgT]):
    """Serves one bound ROUTER on a daemon thread; :meth:`drain` hands out the inbox."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        router: zmq.Socket[bytes],
        *,
        codec: MessageCodec[MsgT],
        address: PeerAddress,
        secret: bytes | None,
        limits: FrameLimits,
        replay: ReplayGuard | None = None,
        inbox_limit: int,
        rejections: Rejections,
        log: FilteringBoundLogger,
    ) -> None:
        self._ctx = ctx
        self._router = router
        self._codec = codec
        self._address = address
        self._secret = secret
        self._limits = limits
        self._replay = replay
        self._inbox_limit = inbox_limit
        self._rejections = rejections
        self._log = log
        self._responder: Callable[[MsgT], MsgT] | None = None
        self._inbox: deque[Inbound[MsgT]] = deque()
        self._inbox_cv = threading.Condition()
        self._woken = False  # a wake no drain has taken yet (under _inbox_cv)
        self._stopping = threading.Event()
        self._wake_lock = threading.Lock()
        self.terminate_context_on_exit = False
        """Set when the channel is closed from this thread: the thread then ends the context."""
        wake_endpoint = f"inproc://moriio-wake-{id(self)}"
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake_endpoint)
        self._wake_tx = ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake_endpoint)
        self._thread = threading.Thread(
            target=self._run, name=f"moriio-zmq-listener-{address.port}", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the thread runs and no stop was requested."""
        return self._thread.is_alive() and not self._stopping.is_set()

    @property
    def on_listener_thread(self) -> bool:
        """True when called from the listener thread (e.g. inside a responder)."""
        return threading.current_thread() is self._thread

    def serve(self, responder: Callable[[MsgT], MsgT]) -> None:
        """Answer requests with ``responder`` from now on."""
        self._responder = responder

    def drain(self, timeout: float) -> list[Inbound[MsgT]]:
        """Everything in the inbox; waits up to ``timeout`` s for the first message, or
        until :meth:`wake`."""
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
        with self._inbox_cv:
            if not self._inbox and timeout > 0 and not self._woken:
                self._inbox_cv.wait_for(
                    lambda: bool(self._inbox) or self._woken or self._stopping.is_set(), timeout
                )
            self._woken = False
            items = list(self._inbox)
            self._inbox.clear()
        return items

    def wake(self) -> None:
        """End the wait of a :meth:`drain` (or of the next one)."""
        with self._inbox_cv:
            self._woken = True
            self._inbox_cv.notify_all()

    def stop(self, join_timeout: float) -> bool:
        """Ask the thread to end and wait for it (unless called from it); True once stopped."""
        with self._wake_lock:
            if not self._stopping.is_set():
                self._stopping.set()
                with contextlib.suppress(zmq.Again):  # its end is closed: the thread has ended
                    self._wake_tx.send(b"", flags=zmq.NOBLOCK)
                self._wake_tx.close(linger=0)
        with self._inbox_cv:
            self._inbox_cv.notify_all()
        if self.on_listener_thread:
            return False
        self._thread.join(join_timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ thread body

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        backoff = 0.01
        try:
            while not self._stopping.is_set():
                try:
                    ready = dict(poller.poll())
                    if self._wake_rx in ready or self._stopping.is_set():
                        break
                    if self._router in ready:
                        self._serve_ready()
                    backoff = 0.01
                except zmq.ContextTerminated:
                    break
                except Exception as exc:  # keep serving whatever happens
                    self._rejections.add(Reason.LISTENER_ERROR, f"{type(exc).__name__}: {exc}")
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 1.0)
        finally:
            self._router.close(linger=0)
            self._wake_rx.close(linger=0)
            if self.terminate_context_on_exit:
                self._ctx.term()

    def _serve_ready(self) -> None:
        """Handle every message already queued on the ROUTER."""
        while not self._stopping.is_set():
            try:
                kept, total = recv_parts(self._router)
            except zmq.Again:
                return
            try:
                self._handle(kept, total)
            except Exception as exc:  # one bad message never stops the listener
                self._rejections.add(
                    Reason.LISTENER_ERROR, f"{type(exc).__name__}: {exc}", source=peer_of(kept[0])
                )

    def _handle(self, kept: list[zmq.Frame], total: int) -> None:
        identity = kept[0]
        try:
            if total > 3:
                raise FrameRejectedError(Reason.BAD_FRAMES, f"{total - 1} frames, expected 1 or 2")
            envelope = framing.decode([f.bytes for f in kept[1:]], self._secret, self._limits)
            if self._replay is not None and envelope.kind in (Kind.MESSAGE, Kind.REQUEST):
                self._replay.check(envelope, time.time())
        except FrameRejectedError as exc:
            self._rejections.add(exc.reason, exc.detail, source=peer_of(identity))
            return
        if envelope.kind is Kind.MESSAGE:
            self._accept(envelope, identity)
        elif envelope.kind is Kind.REQUEST:
            self._answer(envelope, identity)
        else:
            self._rejections.add(
                Reason.STALE_REPLY, "reply sent to a listener", source=peer_of(identity)
            )

    def _decode_body(self, envelope: Envelope, identity: zmq.Frame) -> MsgT | _Refused:
        """The message, or why it was refused (counted)."""
        try:
            return self._codec.decode(envelope.body)
        except MalformedMessageError as exc:
            detail = str(exc)
            # A peer of another protocol version is told which one this listener speaks.
            answer = detail if exc.reason == UNSUPPORTED_VERSION else "malformed request"
        except Exception as exc:  # a codec bug must not look like a valid message
            detail = f"{type(exc).__name__}: {exc}"
            answer = "malformed request"
        self._rejections.add(Reason.INVALID_MESSAGE, detail, source=peer_of(identity))
        return _Refused(answer)

    def _accept(self, envelope: Envelope, identity: zmq.Frame) -> None:
        message = self._decode_body(envelope, identity)
        if isinstance(message, _Refused):
            return
        with self._inbox_cv:
            if len(self._inbox) < self._inbox_limit:
                self._inbox.append(Inbound(message, envelope.sender))
                self._inbox_cv.notify()
                return
        self._rejections.add(
            Reason.INBOX_OVERFLOW,
            f"inbox holds {self._inbox_limit} undrained messages",
            source=peer_of(identity),
        )

    def _answer(self, envelope: Envelope, identity: zmq.Frame) -> None:
        responder = self._responder
        if responder is None:
            self._rejections.add(Reason.UNSERVED_REQUEST, "no responder", source=peer_of(identity))
            self._reply(identity, Kind.ERROR, envelope.correlation, "no responder")
            return
        message = self._decode_body(envelope, identity)
        if isinstance(message, _Refused):
            self._reply(identity, Kind.ERROR, envelope.correlation, message[:MAX_ERROR_CHARS])
            return
        try:
            body: object = dict(self._codec.encode(responder(message)))
        except Exception as exc:
            self._log.exception("responder failed", source=peer_of(identity))
            self._rejections.add(Reason.RESPONDER_ERROR, f"{type(exc).__name__}: {exc}")
            self._reply(identity, Kind.ERROR, envelope.correlation, "responder failed")
            return
        self._reply(identity, Kind.REPLY, envelope.correlation, body)

    def _reply(self, identity: zmq.Frame, kind: Kind, correlation: int, body: object) -> None:
        frames = framing.encode(Envelope(kind, correlation, self._address, body), self._secret)
        try:
            self._router.send_multipart([identity.bytes, *frames], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # requester gone (EHOSTUNREACH) or its queue full
            self._rejections.add(Reason.UNDELIVERABLE_REPLY, str(exc), source=peer_of(identity))
