"""The asking half of handshakes: one request to a peer, its answer checked, and its regions
imported into the transfer engine as a :class:`ConnectedPeer`.

Requests run inline (deterministic fakes) or on a small pool of background threads (real
channels): :meth:`HandshakeClient.begin` starts one, :meth:`HandshakeClient.answers` hands
back those that ended, for the worker's thread to apply.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType

from moriio.domain.kv.head_slices import GroupSlicing, SliceLayout
from moriio.domain.kv.request_plan import Placement
from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
)
from moriio.domain.protocol.tp_layers import check_sliced_layers
from moriio.domain.worker.peer_checks import (
    ConnectedPeer,
    PeerUnavailableError,
    RemoteLayer,
    remote_strides,
)
from moriio.ports import (
    ControlChannel,
    ControlChannelError,
    PeerAddress,
    TransferEngine,
    TransferEngineError,
)

HANDSHAKE_THREADS = 8  # background handshakes that run in parallel
MIN_HANDOFF_KEY_BYTES = 16

Answer = HandshakeReply | Exception  # a peer's reply, or why there is none


class HandshakeClient:
    """Sends our :class:`HandshakeRequest` and turns a compatible reply into a connection.

    ``requires_key``: every peer we ask holds hand-offs we verify (a READ consumer asks
    only producers), so a reply without a hand-off key is refused by name."""

    def __init__(
        self,
        engine: TransferEngine,
        channel: ControlChannel[Message],
        request: HandshakeRequest,
        background: bool,
        local_slicing: Mapping[str, tuple[Sequence[GroupSlicing], int]] | None = None,
        *,
        requires_key: bool = False,
    ) -> None:
        """``local_slicing``: each local layer's slicing and block length, which a peer of
        another TP size must line up with."""
        self._engine = engine
        self._requires_key = requires_key
        self._local_slicing = local_slicing or {}
        self._channel = channel
        self.request = request  # what we send every peer
        self._fingerprint: Fingerprint = request.fingerprint
        self._local_layers: Mapping[str, LayerRegions] = {
            layer.name: layer for layer in request.layers
        }
        self.background = background
        self._answers: queue.SimpleQueue[tuple[PeerAddress, Answer]] = queue.SimpleQueue()
        self._pool = (
            ThreadPoolExecutor(HANDSHAKE_THREADS, thread_name_prefix="moriio-handshake")
            if background
            else None
        )

    def begin(self, address: PeerAddress, timeout: float) -> None:
        """Ask ``address`` off the caller's path; see :meth:`answers`."""
        if self._pool is None:
            self._answers.put((address, self.ask_safely(address, timeout)))
        else:
            self._pool.submit(self._ask_in_background, address, timeout)

    def answers(self) -> Iterator[tuple[PeerAddress, Answer]]:
        """The answers of handshakes begun that ended since the last call."""
        while True:
            try:
                yield self._answers.get_nowait()
            except queue.Empty:
                return

    def ask_safely(self, address: PeerAddress, timeout: float) -> Answer:
        """The peer's reply, or why there is none; never raises (runs on pool threads)."""
        try:
            return self._ask(address, timeout)
        except PeerUnavailableError as exc:
            return exc
        except Exception as exc:  # any adapter failure is this peer's, never the caller's
            return PeerUnavailableError(f"handshake with {address} failed: {exc!r}")

    def attach(self, address: PeerAddress, reply: HandshakeReply) -> ConnectedPeer:
        """Import the peer's regions and trust its hosts; raises PeerUnavailableError when
        they cannot be used (nothing is left attached then)."""
        ours, theirs = self._fingerprint, reply.fingerprint
        try:
            if ours.tp_size != theirs.tp_size:
                check_sliced_layers(
                    self._local_slicing,
                    reply.layers,
                    ours.tp_size,
                    theirs.tp_size,
                    total_kv_heads=ours.total_num_kv_heads,
                    is_mla=ours.is_mla,
                )
            same_tp = ours.tp_size == theirs.tp_size
            strides = remote_strides(self._local_layers, reply.layers, same_tp=same_tp)
            slicing = {lr.name: remote_slicing(lr) for lr in reply.layers}
        except ValueError as exc:
            raise PeerUnavailableError(f"peer {address} is incompatible: {exc}") from exc
        try:
            engine = self._engine.add_peer(reply.engine_metadata)
            spans = tuple(self._engine.import_region(engine, d) for d in reply.spans)
            layers = {
                lr.name: RemoteLayer(
                    self._engine.import_region(engine, lr.descriptors[0]),
                    lr.num_blocks,
                    lr.block_len,
                    strides.get(lr.name),
                    placement=None if lr.span < 0 else Placement(lr.span, lr.span_offset),
                    slicing=slicing[lr.name],
                )
                for lr in reply.layers
            }
        except (TransferEngineError, ValueError) as exc:
            raise PeerUnavailableError(f"peer {address} sent unusable regions: {exc}") from exc
        try:
            self._channel.trust(address.host)
            self._channel.trust(reply.control.host)
        except (ControlChannelError, ValueError) as exc:
            self._engine.remove_peer(engine)
            raise PeerUnavailableError(f"peer {address} sent an unusable address: {exc}") from exc
        return ConnectedPeer(
            address=address,
            engine=engine,
            control=reply.control,
            fingerprint=reply.fingerprint,
            dp_rank=reply.dp_rank,
            tp_rank=reply.tp_rank,
            layers=MappingProxyType(layers),
            instance_id=reply.instance_id,
            generation=reply.generation,
            spans=spans,
            handoff_key=reply.handoff_key,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _ask_in_background(self, address: PeerAddress, timeout: float) -> None:
        self._answers.put((address, self.ask_safely(address, timeout)))

    def _ask(self, address: PeerAddress, timeout: float) -> HandshakeReply:
        try:
            reply = self._channel.request(address, self.request, timeout)
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
        if self._requires_key and len(reply.handoff_key) < MIN_HANDOFF_KEY_BYTES:
            raise PeerUnavailableError(
                f"peer {address} does not sign its hand-offs (its handshake reply carries no "
                "hand-off key): refused, its hand-offs could not be verified"
            )
        return reply


def remote_slicing(layer: LayerRegions) -> tuple[SliceLayout | None, ...]:
    """The peer's slice layouts of ``layer``, per group (None: whole pages)."""
    return tuple(SliceLayout.from_wire(wire) if wire else None for wire in layer.slices)
