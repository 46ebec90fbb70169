"""A peer's handshake checked against ours: its KV layers, the connection it gives, and
what a refusal logs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from moriio.domain.kv.head_slices import SliceLayout
from moriio.domain.kv.request_plan import Placement
from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.domain.protocol.handshake import LayerRegions
from moriio.log import get_logger
from moriio.ports import PeerAddress, PeerId, RemoteRegion

log = get_logger("moriio.peers")
MAX_LOGGED_REFUSALS = 64  # distinct refusals logged per process; repeats are only counted
_logged: set[str] = set()


@dataclass(frozen=True, slots=True)
class RemoteLayer:
    """A peer's layer: its region, block count and block length, ``block_stride`` when
    it differs from ours (None: the same), which remote offsets then use, and where its
    region lies in one of the peer's spans (None: in none). ``slicing``: per KV-cache
    group, where the peer rank's shard of a page lies (None: whole pages; empty: the peer
    did not say)."""

    region: RemoteRegion
    num_blocks: int
    block_len: int
    block_stride: int | None = None
    placement: Placement | None = None
    slicing: tuple[SliceLayout | None, ...] = ()


class PeerUnavailableError(RuntimeError):
    """A peer could not be reached, refused us, or is incompatible; the message says which."""


class PeerRestartedError(PeerUnavailableError):
    """The peer at an address is not the instance a transfer belongs to: that instance is gone.

    Its memory went with it, so the transfer cannot be served by whatever process answers
    at the address now.
    """


class PeerGenerationError(PeerUnavailableError):
    """A transfer names a registration generation of the peer that is not the one it serves:
    one retired by a sleep (its KV memory was released) or one it does not have."""


@dataclass(frozen=True, slots=True)
class ConnectedPeer:
    """A handshaken peer rank: its engine, its control address, and its layers by name.

    ``handoff_key``: the key its engine signs READ hand-offs with (empty: it signs none)."""

    address: PeerAddress
    engine: PeerId
    control: PeerAddress
    fingerprint: Fingerprint
    dp_rank: int
    tp_rank: int
    layers: Mapping[str, RemoteLayer]
    instance_id: str
    generation: int = 1  # the registration generation its layers belong to
    spans: tuple[RemoteRegion, ...] = ()  # the peer's spans, imported
    handoff_key: bytes = b""


def remote_strides(
    ours: Mapping[str, LayerRegions], theirs: Iterable[LayerRegions], *, same_tp: bool = True
) -> dict[str, int]:
    """The peer's block strides that differ from ours, once its block lengths are checked
    equal to ours layer by layer (a block moves as one run of our ``block_len``; between
    different TP sizes the lengths scale with the shard, and the shards are checked apart).

    ValueError names the first layer whose block length differs.
    """
    strides = {}
    for layer in theirs:
        local = ours.get(layer.name)
        if local is None:
            continue
        if same_tp and layer.block_len != local.block_len:
            raise ValueError(
                f"layer {layer.name!r} block_len differs "
                f"(ours={local.block_len}, theirs={layer.block_len})"
            )
        if layer.block_stride and layer.block_stride != local.block_stride:
            strides[layer.name] = layer.block_stride
    return strides


def log_refusal(control: PeerAddress, exc: IncompatiblePeerError) -> None:
    """Log, once per distinct difference, a handshake refused for its fingerprint: here both
    sides' values are shown (the peer is only told which fields differ)."""
    text = str(exc)
    if text in _logged or len(_logged) >= MAX_LOGGED_REFUSALS:
        return
    _logged.add(text)
    log.warning(
        "handshake refused: the peer's KV bytes mean something else", peer=str(control), reason=text
    )
