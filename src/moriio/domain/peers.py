"""Handshakes: learning a peer's engine and KV regions, and refusing incompatible peers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from moriio.domain.handshake import Fingerprint, IncompatiblePeerError
from moriio.domain.kv_registry import LocalKV
from moriio.domain.messages import HandshakeRejected, HandshakeReply, HandshakeRequest, Message
from moriio.ports import (
    Clock,
    ControlChannel,
    ControlChannelError,
    PeerAddress,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
)


class PeerUnavailableError(RuntimeError):
    """A peer could not be reached, refused us, or is incompatible; the message says which."""


@dataclass(frozen=True, slots=True)
class RemoteLayer:
    region: RemoteRegion
    num_blocks: int
    block_len: int


@dataclass(frozen=True, slots=True)
class ConnectedPeer:
    """A handshaken peer rank: its engine, its control address, and its layers by name."""

    address: PeerAddress
    engine: PeerId
    control: PeerAddress
    fingerprint: Fingerprint
    dp_rank: int
    tp_rank: int
    layers: Mapping[str, RemoteLayer]


class PeerDirectory:
    """Connected peers by the address that was dialed, plus the answer to peers' handshakes."""

    def __init__(
        self,
        *,
        engine: TransferEngine,
        channel: ControlChannel[Message],
        local: LocalKV,
        fingerprint: Fingerprint,
        control: PeerAddress,
        dp_rank: int,
        tp_rank: int,
        clock: Clock,
        handshake_timeout: float,
        retry_after: float = 1.0,
    ) -> None:
        self._engine = engine
        self._channel = channel
        self._fingerprint = fingerprint
        self._clock = clock
        self._timeout = handshake_timeout
        self._retry_after = retry_after
        self._peers: dict[PeerAddress, ConnectedPeer] = {}
        self._failed_until: dict[PeerAddress, tuple[float, str]] = {}
        self.handshakes = 0
        self.handshake_failures = 0
        self.rejected_requests = 0
        self._request = HandshakeRequest(
            fingerprint=fingerprint,
            engine_metadata=engine.metadata(),
            layers=local.layer_regions(),
            control=control,
            dp_rank=dp_rank,
            tp_rank=tp_rank,
        )
        self._reply = HandshakeReply(
            fingerprint=fingerprint,
            engine_metadata=self._request.engine_metadata,
            layers=self._request.layers,
            control=control,
            dp_rank=dp_rank,
            tp_rank=tp_rank,
        )

    def respond(self, message: Message) -> Message:
        """Answer a peer's handshake (runs on a listener thread; reads immutable data only)."""
        if not isinstance(message, HandshakeRequest):
            self.rejected_requests += 1
            return HandshakeRejected(f"expected a handshake request, got {type(message).__name__}")
        try:
            self._fingerprint.check_compatible(message.fingerprint)
        except IncompatiblePeerError as exc:
            self.rejected_requests += 1
            return HandshakeRejected(str(exc))
        return self._reply

    def connect(self, address: PeerAddress) -> ConnectedPeer:
        """The peer at ``address``, handshaking on first use. Raises PeerUnavailableError."""
        peer = self._peers.get(address)
        if peer is not None:
            return peer
        now = self._clock.now()
        failed = self._failed_until.get(address)
        if failed is not None and now < failed[0]:
            raise PeerUnavailableError(f"peer {address} unavailable: {failed[1]}")
        try:
            peer = self._handshake(address)
        except PeerUnavailableError as exc:
            self.handshake_failures += 1
            self._failed_until[address] = (now + self._retry_after, str(exc))
            raise
        self._failed_until.pop(address, None)
        self._peers[address] = peer
        self.handshakes += 1
        return peer

    def forget(self, address: PeerAddress) -> None:
        """Drop a peer (it died or misbehaved); the next use handshakes again."""
        peer = self._peers.pop(address, None)
        if peer is not None and all(p.engine != peer.engine for p in self._peers.values()):
            self._engine.remove_peer(peer.engine)

    def close(self) -> None:
        for address in list(self._peers):
            self.forget(address)

    def _handshake(self, address: PeerAddress) -> ConnectedPeer:
        try:
            reply = self._channel.request(address, self._request, self._timeout)
        except ControlChannelError as exc:
            raise PeerUnavailableError(f"handshake with {address} failed: {exc}") from exc
        if isinstance(reply, HandshakeRejected):
            raise PeerUnavailableError(f"peer {address} rejected our handshake: {reply.reason}")
        if not isinstance(reply, HandshakeReply):
            raise PeerUnavailableError(
                f"peer {address} answered a handshake with {type(reply).__name__}"
            )
        try:
            self._fingerprint.check_compatible(reply.fingerprint)
        except IncompatiblePeerError as exc:
            raise PeerUnavailableError(f"peer {address} is {exc}") from exc
        try:
            engine = self._engine.add_peer(reply.engine_metadata)
            layers = {
                lr.name: RemoteLayer(
                    self._engine.import_region(engine, lr.descriptors[0]),
                    lr.num_blocks,
                    lr.block_len,
                )
                for lr in reply.layers
            }
        except (TransferEngineError, ValueError) as exc:
            raise PeerUnavailableError(f"peer {address} sent unusable regions: {exc}") from exc
        self._channel.trust(address.host)
        self._channel.trust(reply.control.host)
        return ConnectedPeer(
            address=address,
            engine=engine,
            control=reply.control,
            fingerprint=reply.fingerprint,
            dp_rank=reply.dp_rank,
            tp_rank=reply.tp_rank,
            layers=MappingProxyType(layers),
        )
