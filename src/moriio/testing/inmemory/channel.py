"""In-memory ControlChannel: a fake of the port for tests of the control plane.

Channels find each other through an :class:`InMemoryNetwork` that the caller creates and
hands to every channel (there is no module-level registry). The fake keeps the real
channel's contract: the same trust rules (own host, ``trusted_hosts``, :meth:`trust`),
request/reply through a responder, a bounded inbox whose overflow is counted, and rejections
counted by the same reason names. Every message is encoded by the sender's codec, copied
through msgpack and decoded by the receiver's codec, so malformed input fails exactly where
it would on the wire.

The fake injects no faults: wrap it in :class:`~moriio.adapters.chaos.ChaosControlChannel` for
that. Nothing here blocks but :meth:`InMemoryControlChannel.drain` given a timeout, which
waits in real time, as the real channel does, until a message arrives or
:meth:`~InMemoryControlChannel.wake` is called (a thread that drains sleeps until it has work);
a request that cannot be answered advances the network's clock (a
:class:`~moriio.testing.inmemory.clock.FakeClock`) by its timeout and raises.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic

import msgpack

from moriio.ports import (
    Clock,
    ControlChannelError,
    Inbound,
    MalformedMessageError,
    MessageCodec,
    PeerAddress,
    RequestTimeoutError,
    UntrustedPeerError,
)
from moriio.ports.control_channel import MsgT

_FIRST_EPHEMERAL_PORT = 49152


def _canonical_host(host: str) -> str:
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"host must be a non-empty string, got {host!r}")
    return host.strip().lower()


def _wire_copy(value: object) -> object:
    """What the receiver would see: the value after a msgpack round trip."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=True)


@dataclass(frozen=True, slots=True)
class Sent(Generic[MsgT]):
    """One message a channel was asked to send (whatever then happened to it)."""

    peer: PeerAddress
    message: MsgT


class InMemoryNetwork:
    """Joins in-memory channels of one process, keyed by address; one lock for all."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._channels: dict[PeerAddress, InMemoryControlChannel[Any]] = {}
        self._next_port: dict[str, int] = {}

    def attach(self, channel: InMemoryControlChannel[Any], host: str, port: int) -> PeerAddress:
        """Register ``channel`` at ``host:port`` (port 0: the next free port)."""
        with self.lock:
            if port == 0:
                port = self._next_port.get(host, _FIRST_EPHEMERAL_PORT)
                while PeerAddress(host, port) in self._channels:
                    port += 1
                self._next_port[host] = port + 1
            address = PeerAddress(host, port)
            if address in self._channels:
                raise ValueError(f"address {address} is already in use on this network")
            self._channels[address] = channel
            return address

    def detach(self, address: PeerAddress) -> None:
        """Forget the channel at ``address``."""
        with self.lock:
            self._channels.pop(address, None)

    def lookup(self, address: PeerAddress) -> InMemoryControlChannel[Any] | None:
        """The channel listening at ``address``, if any."""
        with self.lock:
            return self._channels.get(address)

    def inject(self, address: PeerAddress, raw: object, sender: PeerAddress | None = None) -> None:
        """Hand a raw wire value to the channel at ``address`` as if a peer had sent it."""
        with self.lock:
            target = self._channels.get(address)
            if target is None:
                raise ValueError(f"no channel listens at {address}")
            target._receive(_wire_copy(raw), sender)


class InMemoryControlChannel(Generic[MsgT]):
    """A ControlChannel on an :class:`InMemoryNetwork`; records ``sent`` and ``requests``."""

    def __init__(
        self,
        network: InMemoryNetwork,
        codec: MessageCodec[MsgT],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        trusted_hosts: Iterable[str] = (),
        inbox_limit: int = 10_000,
        max_frame_bytes: int = 1 << 20,
    ) -> None:
        host = _canonical_host(host)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        if inbox_limit < 1:
            raise ValueError(f"inbox_limit must be >= 1, got {inbox_limit}")
        self._network = network
        self._codec = codec
        self._trusted = {_canonical_host(h) for h in trusted_hosts} | {host}
        self._inbox_limit = inbox_limit
        self._max_frame_bytes = max_frame_bytes
        self._responder: Callable[[MsgT], MsgT] | None = None
        self._inbox: list[Inbound[MsgT]] = []
        self._rejected: Counter[str] = Counter()
        self._dropped: Counter[PeerAddress] = Counter()
        self._closed = False
        self._arrived = threading.Condition(network.lock)  # notified on a message or a wake
        self._woken = False  # a wake no drain has taken yet
        self.sent: list[Sent[MsgT]] = []
        """Every :meth:`send` accepted (trusted peer, open channel), in order."""
        self.requests: list[Sent[MsgT]] = []
        """Every :meth:`request` made, in order."""
        self._address = network.attach(self, host, port)

    # ------------------------------------------------------------------ port

    @property
    def address(self) -> PeerAddress:
        """Where peers reach this channel."""
        return self._address

    @property
    def rejected(self) -> Mapping[str, int]:
        """Dropped inbound messages by reason (same names as the ZMQ channel)."""
        with self._network.lock:
            return MappingProxyType(dict(self._rejected))

    @property
    def dropped_sends(self) -> Mapping[PeerAddress, int]:
        """Sends to an address where no channel listens."""
        with self._network.lock:
            return MappingProxyType(dict(self._dropped))

    @property
    def listener_alive(self) -> bool:
        """True until :meth:`close`."""
        return not self._closed

    @property
    def trusted_hosts(self) -> frozenset[str]:
        """The hosts this channel may send to now."""
        with self._network.lock:
            return frozenset(self._trusted)

    def serve(self, responder: Callable[[MsgT], MsgT]) -> None:
        """Answer requests with ``responder`` (called on the requester's thread)."""
        self._check_open()
        self._responder = responder

    def trust(self, host: str) -> None:
        """Allow sends to ``host``."""
        canonical = _canonical_host(host)
        with self._network.lock:
            self._trusted.add(canonical)

    def send(self, peer: PeerAddress, message: MsgT) -> None:
        """Deliver ``message`` to ``peer`` at once; never blocks."""
        self._check_open()
        self._check_trusted(peer)
        raw = self._encode(message)
        with self._network.lock:
            self.sent.append(Sent(peer, message))
            target = self._network.lookup(peer)
            if target is None:
                self._dropped[peer] += 1
                return
            target._receive(_wire_copy(raw), self._address)

    def request(self, peer: PeerAddress, message: MsgT, timeout: float) -> MsgT:
        """Ask ``peer``'s responder synchronously.

        No channel at ``peer`` advances the network clock by ``timeout`` and raises
        :class:`RequestTimeoutError`, as does a responder slower than ``timeout`` (its reply
        is dropped, as a real channel drops a late one); a missing
        responder, a malformed request or reply, or a responder exception raise
        :class:`ControlChannelError`.
        """
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._check_open()
        self._check_trusted(peer)
        raw = self._encode(message)
        with self._network.lock:
            self.requests.append(Sent(peer, message))
            target = self._network.lookup(peer)
            if target is None:
                self._sleep(timeout)
                raise RequestTimeoutError(f"no reply from {peer} within {timeout:g} s")
            started = self._times()
            raw_reply = target._answer(_wire_copy(raw))
            real, clock = self._times()
            if max(real - started[0], clock - started[1]) > timeout:
                raise RequestTimeoutError(f"no reply from {peer} within {timeout:g} s")
        try:
            return self._codec.decode(_wire_copy(raw_reply))
        except MalformedMessageError as exc:
            self._count("invalid_message")
            raise ControlChannelError(f"malformed reply from {peer}: {exc}") from exc

    def drain(self, timeout: float = 0.0) -> list[Inbound[MsgT]]:
        """Messages received since the last call, in arrival order; when there are none,
        waits up to ``timeout`` seconds (real time) for one, or for :meth:`wake`."""
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
        with self._network.lock:
            if not self._inbox and timeout > 0 and not self._woken and not self._closed:
                self._arrived.wait_for(
                    lambda: bool(self._inbox) or self._woken or self._closed, timeout
                )
            self._woken = False
            arrived, self._inbox = self._inbox, []
            return arrived

    def wake(self) -> None:
        """End a :meth:`drain`'s wait now (or the next one's)."""
        with self._network.lock:
            self._woken = True
            self._arrived.notify_all()

    def is_listening(self, peer: PeerAddress, timeout: float) -> bool | None:
        """Whether a channel is attached at ``peer`` now."""
        self._check_trusted(peer)
        with self._network.lock:
            return self._network.lookup(peer) is not None

    def disconnect(self, peer: PeerAddress) -> None:
        """Nothing to close in memory; kept for parity with the ZMQ channel."""

    def close(self) -> None:
        """Leave the network; idempotent. Undrained messages stay drainable."""
        with self._network.lock:
            if not self._closed:
                self._closed = True
                self._network.detach(self._address)
                self._arrived.notify_all()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise ControlChannelError(f"control channel {self._address} is closed")

    def _check_trusted(self, peer: PeerAddress) -> None:
        with self._network.lock:
            trusted = peer.host.strip().lower() in self._trusted
        if not trusted:
            raise UntrustedPeerError(
                f"refusing to dial untrusted host {peer.host!r} (peer {peer}): it was neither "
                "learned through a handshake nor listed in trusted_remote_hosts"
            )
        if isinstance(peer.port, bool) or not 0 < peer.port < 65536:
            raise ValueError(f"peer port must be in 1..65535, got {peer.port!r} for {peer}")

    def _encode(self, message: MsgT) -> object:
        value = dict(self._codec.encode(message))
        size = len(msgpack.packb(value, use_bin_type=True))
        if size > self._max_frame_bytes:
            raise ControlChannelError(
                f"encoded message is {size} bytes, over max_frame_bytes {self._max_frame_bytes}"
            )
        return value

    def _times(self) -> tuple[float, float]:
        """Real time and the network clock's (a responder may spend either)."""
        clock = self._network.clock
        return time.monotonic(), time.monotonic() if clock is None else clock.now()

    def _sleep(self, seconds: float) -> None:
        if self._network.clock is not None and seconds > 0:
            self._network.clock.sleep(seconds)

    def _count(self, reason: str) -> None:
        with self._network.lock:
            self._rejected[reason] += 1

    def _decode(self, raw: object) -> MsgT | None:
        try:
            return self._codec.decode(raw)
        except Exception:  # a MalformedMessageError, or a codec bug: never a valid message
            self._count("invalid_message")
            return None

    def _receive(self, raw: object, sender: PeerAddress | None) -> None:
        """Validate and enqueue one inbound message (called with the network lock held)."""
        message = self._decode(raw)
        if message is None:
            return
        if len(self._inbox) >= self._inbox_limit:
            self._count("inbox_overflow")
            return
        self._inbox.append(Inbound(message, sender))
        self._arrived.notify_all()

    def _answer(self, raw: object) -> object:
        """Run the responder on ``raw`` and return the encoded reply."""
        responder = self._responder
        if responder is None:
            self._count("unserved_request")
            raise ControlChannelError(f"peer {self._address} could not answer: no responder")
        message = self._decode(raw)
        if message is None:
            raise ControlChannelError(f"peer {self._address} could not answer: malformed request")
        try:
            return dict(self._codec.encode(responder(message)))
        except Exception as exc:
            self._count("responder_error")
            raise ControlChannelError(
                f"peer {self._address} could not answer: responder failed"
            ) from exc
