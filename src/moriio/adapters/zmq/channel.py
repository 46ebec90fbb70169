"""ZMQ implementation of the :class:`~moriio.ports.ControlChannel` port.

Sockets and threads
    Each channel owns one ``zmq.Context``. A ROUTER socket bound to ``host:port`` is used
    only by the channel's listener thread, which validates inbound frames, fills a bounded
    inbox and answers requests. Outbound traffic runs on the caller's thread: one-way sends
    go through a cached DEALER per peer, guarded by one lock; each request uses a cached
    DEALER per peer, dedicated to requests and guarded by a per-peer lock (so concurrent
    requests to one peer take turns, and a request never waits behind one-way traffic).
    ZMQ sockets are not thread-safe; the locks serialise every use, which makes moving a
    socket between caller threads safe.

Sends never block on a peer
    A DEALER queues up to ``send_hwm`` messages for a peer that is not (yet) connected and
    ZMQ delivers them once the connection is up (it reconnects on its own). When the queue
    is full, :meth:`ZmqControlChannel.send` drops the message, counts it in
    ``dropped_sends[peer]`` and logs a warning; the caller returns at once either way.
    Sockets use linger 0, so :meth:`close` discards whatever is still queued.

Inbound frames are untrusted
    Size is checked before parsing (``max_frame_bytes``; frames above twice that are cut by
    ZMQ's ``MAXMSGSIZE`` and the sender is disconnected), the HMAC tag before unpacking,
    msgpack runs with explicit limits, and the codec validates the body. Anything that fails
    is logged (rate-limited) with its reason, counted in ``rejected`` and dropped; the
    listener keeps serving. ``Inbound.sender`` is the address the peer *claims*; only a
    shared secret makes that claim (and everything else) authentic. With a secret, every
    envelope also carries a fresh nonce and its send time, and the listener refuses a frame
    it has seen before or one outside the replay window (``replayed`` / ``stale_frame``).

Bounded resources, port errors only
    At most ``max_peer_sockets`` outbound sockets of each kind stay open; the least recently
    used one is closed when another peer is dialled (:attr:`evicted_sockets` counts them),
    so thousands of distinct targets never exhaust file descriptors. Every ZMQ failure on a
    caller's path surfaces as :class:`ControlChannelError`, never as ``zmq.ZMQError``.
"""

from __future__ import annotations

import itertools
import math
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final, Generic

import zmq
from structlog.typing import FilteringBoundLogger

from moriio.adapters.zmq import framing
from moriio.adapters.zmq.framing import Envelope, FrameLimits, Kind
from moriio.adapters.zmq.listener import Listener
from moriio.adapters.zmq.requests import RequestSockets
from moriio.adapters.zmq.sockets import (
    Rejections,
    bind_router,
    bound_port,
    connect_dealer,
    should_log,
)
from moriio.adapters.zmq.trust import InvalidPeerError, TrustList, is_wildcard, normalize_host
from moriio.domain.values.hosts import InvalidHostError
from moriio.log import get_logger
from moriio.ports import (
    ControlChannelError,
    Inbound,
    MessageCodec,
    PeerAddress,
)
from moriio.ports.control_channel import MsgT

_DEFAULT_MAX_FRAME_BYTES: Final = 1 << 20
_JOIN_TIMEOUT_S: Final = 5.0
DEFAULT_MAX_PEER_SOCKETS: Final = 256


class ZmqControlChannel(Generic[MsgT]):
    """A ROUTER listener plus cached DEALER senders, speaking msgpack envelopes.

    ``port=0`` binds an ephemeral port; :attr:`address` reports the one in use, with
    ``advertise_host`` in place of ``host`` when given (e.g. bind ``0.0.0.0``, advertise the
    node's address). ``trusted_hosts`` plus the channel's own hosts may be dialed at once;
    others only after :meth:`trust`; ``trust_any`` dials any valid host. A ``secret`` (at
    least 16 bytes) makes every message carry an HMAC-SHA256 tag over a nonce and a send time
    and rejects untagged, wrongly tagged or replayed ones.
    """

    def __init__(
        self,
        codec: MessageCodec[MsgT],
        host: str,
        port: int,
        *,
        trusted_hosts: Iterable[str] = (),
        trust_any: bool = False,
        secret: bytes | None = None,
        max_frame_bytes: int | None = None,
        inbox_limit: int = 10_000,
        send_hwm: int = 1000,
        limits: FrameLimits | None = None,
        advertise_host: str | None = None,
        max_peer_sockets: int = DEFAULT_MAX_PEER_SOCKETS,
        replay_window: float = framing.DEFAULT_REPLAY_WINDOW_S,
        logger: FilteringBoundLogger | None = None,
    ) -> None:
        host = normalize_host(host)
        advertised = host if advertise_host is None else normalize_host(advertise_host)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        if inbox_limit < 1:
            raise ValueError(f"inbox_limit must be >= 1, got {inbox_limit}")
        if send_hwm < 1:
            raise ValueError(f"send_hwm must be >= 1, got {send_hwm}")
        if max_peer_sockets < 1:
            raise ValueError(f"max_peer_sockets must be >= 1, got {max_peer_sockets}")
        self._codec = codec
        self._secret = framing.check_secret(secret)
        if limits is None:
            size = _DEFAULT_MAX_FRAME_BYTES if max_frame_bytes is None else max_frame_bytes
            limits = FrameLimits(max_frame_bytes=size)
        elif max_frame_bytes is not None and max_frame_bytes != limits.max_frame_bytes:
            raise ValueError(
                f"max_frame_bytes={max_frame_bytes} contradicts "
                f"limits.max_frame_bytes={limits.max_frame_bytes}; pass one of them"
            )
        self._limits = limits
        self._transport_cap = max(2 * self._limits.max_frame_bytes, 4096)
        self._inbox_limit = inbox_limit
        self._send_hwm = send_hwm
        own = [h for h in (host, advertised) if not is_wildcard(h)]  # 0.0.0.0 is no peer
        self._trust = TrustList([*trusted_hosts, *own], trust_any=trust_any)
        self._max_sockets = max_peer_sockets
        self._evicted = 0
        self._correlation = itertools.count(1)
        self._stats_lock = threading.Lock()
        self._dropped: Counter[PeerAddress] = Counter()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._senders: OrderedDict[PeerAddress, zmq.Socket[bytes]] = OrderedDict()

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=1)
        try:
            try:
                router = bind_router(self._ctx, host, port, self._transport_cap, send_hwm)
            except zmq.ZMQError as exc:
                raise ControlChannelError(f"cannot listen on {host}:{port}: {exc}") from exc
            self._address = PeerAddress(advertised, bound_port(router))
            base = logger if logger is not None else get_logger("moriio.zmq")
            self._log: FilteringBoundLogger = base.bind(channel=str(self._address))
            self._rejections = Rejections(self._log)
            self._requests = RequestSockets(
                self._ctx,
                codec,
                secret=self._secret,
                limits=self._limits,
                transport_cap=self._transport_cap,
                send_hwm=send_hwm,
                max_sockets=max_peer_sockets,
                rejections=self._rejections,
                on_evict=self._count_eviction,
            )
            self._listener = Listener(
                self._ctx,
                router,
                codec=codec,
                address=self._address,
                secret=self._secret,
                limits=self._limits,
                replay=framing.ReplayGuard(replay_window) if self._secret is not None else None,
                inbox_limit=inbox_limit,
                rejections=self._rejections,
                log=self._log,
            )
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._listener.start()

    # ------------------------------------------------------------------ properties

    @property
    def address(self) -> PeerAddress:
        """Where peers reach this channel."""
        return self._address

    @property
    def rejected(self) -> Mapping[str, int]:
        """Snapshot of dropped inbound messages, by reason (see :class:`Reason`)."""
        return self._rejections.snapshot()

    @property
    def dropped_sends(self) -> Mapping[PeerAddress, int]:
        """Snapshot of one-way sends dropped because a peer's queue was full."""
        with self._stats_lock:
            return MappingProxyType(dict(self._dropped))

    @property
    def listener_alive(self) -> bool:
        """True while the listener thread runs (it stops only on :meth:`close`)."""
        return self._listener.alive

    @property
    def trusted_hosts(self) -> frozenset[str]:
        """The hosts this channel may dial now."""
        return self._trust.snapshot()

    @property
    def evicted_sockets(self) -> int:
        """Outbound sockets closed to stay within ``max_peer_sockets``."""
        with self._stats_lock:
            return self._evicted

    @property
    def open_peers(self) -> frozenset[PeerAddress]:
        """Peers with a cached outbound socket."""
        with self._send_lock:
            senders = frozenset(self._senders)
        return senders | self._requests.peers

    # ------------------------------------------------------------------ port methods

    def serve(self, responder: Callable[[MsgT], MsgT]) -> None:
        """Answer requests with ``responder``, called on the listener thread.

        A responder exception is logged, counted as ``responder_error`` and answered with an
        error reply, so the requester fails at once with :class:`ControlChannelError`.
        """
        self._check_open()
        self._listener.serve(responder)

    def trust(self, host: str) -> None:
        """Allow sends to ``host`` (learned through a handshake)."""
        try:
            self._trust.add(host)
        except InvalidHostError as exc:
            raise InvalidPeerError(f"cannot trust {host!r:.80}: {exc}") from None

    def send(self, peer: PeerAddress, message: MsgT) -> None:
        """Queue ``message`` for ``peer``; never blocks (see the module docstring)."""
        self._check_open()
        peer = self._trust.check(peer)
        frames = self._frames(Kind.MESSAGE, 0, message)
        with self._send_lock:
            self._check_open()
            sock = self._senders.get(peer)
            if sock is None:
                sock = self._open(self._senders, peer)
            else:
                self._senders.move_to_end(peer)
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                with self._stats_lock:
                    self._dropped[peer] += 1
                    count = self._dropped[peer]
                if should_log(count):
                    self._log.warning(
                        "control send dropped: peer queue full",
                        peer=str(peer),
                        send_hwm=self._send_hwm,
                        dropped=count,
                    )
            except zmq.ZMQError as exc:
                self._senders.pop(peer, None)
                sock.close(linger=0)
                raise ControlChannelError(f"cannot send to {peer}: {exc}") from exc

    def request(self, peer: PeerAddress, message: MsgT, timeout: float) -> MsgT:
        """Send ``message`` to ``peer``'s responder and wait up to ``timeout`` s for the reply.

        Raises :class:`RequestTimeoutError` when no reply comes in time (the request socket is
        then discarded, so a late reply cannot be mistaken for a later answer), and
        :class:`ControlChannelError` when the peer answers with an error or a malformed reply.
        """
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._check_open()
        peer = self._trust.check(peer)
        correlation = next(self._correlation)
        frames = self._frames(Kind.REQUEST, correlation, message)
        deadline = time.monotonic() + timeout
        with self._requests.lock(peer):
            try:
                return self._requests.exchange(
                    peer, frames, correlation, deadline, timeout, self._check_open
                )
            except zmq.ZMQError as exc:
                self._requests.discard(peer)
                raise ControlChannelError(f"request to {peer} failed: {exc}") from exc

    def drain(self, timeout: float = 0.0) -> list[Inbound[MsgT]]:
        """Validated messages received since the last call; waits up to ``timeout`` s for
        one, or until :meth:`wake`."""
        return self._listener.drain(timeout)

    def wake(self) -> None:
        """End a :meth:`drain`'s wait now (or the next one's)."""
        self._listener.wake()

    def is_listening(self, peer: PeerAddress, timeout: float) -> bool | None:
        """Whether ``peer``'s host accepts a TCP connection on its port (see the port)."""
        self._check_open()
        peer = self._trust.check(peer)
        try:
            socket.create_connection((peer.host, peer.port), timeout=timeout).close()
        except ConnectionRefusedError:
            return False
        except OSError:
            return None
        return True

    def disconnect(self, peer: PeerAddress) -> None:
        """Close the cached sockets for ``peer`` (queued messages are discarded)."""
        with self._send_lock:
            sock = self._senders.pop(peer, None)
            if sock is not None:
                sock.close(linger=0)
        with self._requests.lock(peer):
            self._requests.discard(peer)

    def close(self) -> None:
        """Stop the listener thread and close every socket; a second call does nothing."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        # Closed from a responder, the listener thread ends the context on its way out.
        self._listener.terminate_context_on_exit = self._listener.on_listener_thread
        stopped = self._listener.stop(_JOIN_TIMEOUT_S)
        with self._send_lock:
            for sock in self._senders.values():
                sock.close(linger=0)
            self._senders.clear()
        self._requests.close_all()
        if stopped:
            self._ctx.term()
        elif not self._listener.terminate_context_on_exit:
            self._log.error("listener thread did not stop; leaving its context open")

    def __enter__(self) -> ZmqControlChannel[MsgT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ outbound helpers

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ControlChannelError(f"control channel {self._address} is closed")

    def _frames(self, kind: Kind, correlation: int, message: MsgT) -> list[bytes]:
        body = dict(self._codec.encode(message))
        frames = framing.encode(Envelope(kind, correlation, self._address, body), self._secret)
        if len(frames[0]) > self._limits.max_frame_bytes:
            raise ControlChannelError(
                f"encoded message is {len(frames[0])} bytes, over max_frame_bytes "
                f"{self._limits.max_frame_bytes}"
            )
        return frames

    def _open(
        self, cache: OrderedDict[PeerAddress, zmq.Socket[bytes]], peer: PeerAddress
    ) -> zmq.Socket[bytes]:
        """A new sender socket for ``peer`` in ``cache``, closing the least recently used
        one when the cache is full (``_send_lock`` held)."""
        try:
            sock = connect_dealer(self._ctx, peer, self._transport_cap, self._send_hwm)
        except zmq.ZMQError as exc:
            raise ControlChannelError(f"cannot connect to {peer}: {exc}") from exc
        while len(cache) >= self._max_sockets:
            _, old = cache.popitem(last=False)
            old.close(linger=0)  # a lingering socket still counts against ZMQ_MAX_SOCKETS
            self._count_eviction()
        cache[peer] = sock
        return sock

    def _count_eviction(self) -> None:
        with self._stats_lock:
            self._evicted += 1
