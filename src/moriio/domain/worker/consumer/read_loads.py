"""A READ's state, its posts (a batch per layer, or per request) and the check that it fits
the producer's lease."""

from __future__ import annotations

from dataclasses import dataclass

from moriio.domain.params.orders import ReadOrder
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.peer_checks import ConnectedPeer
from moriio.domain.worker.poster import PostRequest
from moriio.domain.worker.request_posts import request_posts
from moriio.ports import PeerAddress, TransferOp


@dataclass(frozen=True, slots=True)
class ReadInfo:
    request_id: str
    local_block_ids: tuple[int, ...]
    release_to: tuple[PeerAddress, ...]
    instance_id: str | None  # the producer instance whose blocks are read
    token: str  # the producer's capability for the transfer, echoed in releases
    source: PeerAddress | None = None  # the producer rank read from (None: nothing to read)
    sources: tuple[PeerAddress, ...] = ()  # every producer rank read from (TP sizes differ)
    started: float = 0.0  # clock time the read order arrived
    load_async: bool = False  # reported in finished_recving once terminal
    verified: bool = False  # the hand-off verified for this request: it may release it


@dataclass(frozen=True, slots=True)
class ParkedRead:
    """A read waiting for its producer's handshake."""

    order: ReadOrder
    info: ReadInfo
    address: PeerAddress  # the handshake address
    wall: float  # wall-clock time when parked (the lease is checked again on resuming)
    at: float  # clock time when parked
    sources: tuple[tuple[int, PeerAddress], ...] = ()  # producer ranks read from, if several


def plan_reads(kv: LocalKV, order: ReadOrder, peer: ConnectedPeer) -> list[PostRequest]:
    """The READ posts of ``order``: one per layer for a layer-wise load (the forward waits
    layer by layer), one per pair of spans otherwise; ValueError when the peer lacks a
    layer."""
    return request_posts(
        order.transfer_id,
        TransferOp.READ,
        kv,
        peer,
        order.local_block_ids,
        order.remote_block_ids,
        by_span=order.load_async,
    )


def lease_problem(order: ReadOrder, wall_now: float, policy: TransferPolicy) -> str | None:
    """Why a read could outlive the producer's lease on its blocks; None when it cannot.

    The lease is on the producer's clock: it is shortened here by the skew allowance. A
    lease further ahead than any configuration makes is refused as absurd.
    """
    expires = order.lease_expires_at
    if expires is None:
        return None
    if policy.lease_absurd(expires, wall_now):
        return f"the producer's lease {expires!r} is too far in the future"
    if policy.read_lease_too_short(expires, wall_now):
        return "the producer's lease ends too soon"
    return None
