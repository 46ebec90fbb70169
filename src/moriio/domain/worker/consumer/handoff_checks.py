"""A READ consumer's checks of a hand-off before it reads it or releases it on a request's
behalf: signed by the producer that holds the blocks, for this request's prompt.

The producer's key comes from its handshake reply (:class:`ConnectedPeer`); what the params
say comes from the scheduler (:class:`~moriio.domain.params.handoff_tags.HandoffCheck`).
"""

from __future__ import annotations

from moriio.domain.kv.tp import remote_tp_rank
from moriio.domain.params.handoff_tags import HandoffCheck, HandoffRefusal, verify
from moriio.domain.params.transfer_params import PeerEndpoint, port_offset
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.peer_checks import ConnectedPeer
from moriio.log import get_logger
from moriio.ports import PeerAddress

log = get_logger("moriio.consumer")

Refusal = tuple[HandoffRefusal, str]
UNSIGNED = (
    HandoffRefusal.UNSIGNED,
    "the params carry no signed hand-off (remote_engine_id lacks the producer's signature): "
    "only params a prefill returned are loaded",
)


def handoff_problem(check: HandoffCheck | None, peer: ConnectedPeer) -> Refusal | None:
    """Why ``check`` may not be loaded (or released) from ``peer`` (None: it may)."""
    if check is None:
        return UNSIGNED
    return verify(peer.handoff_key, peer.instance_id, check)


def source_address(
    ctx: WorkerContext, endpoint: PeerEndpoint, source_rank: int, peer_tp: int
) -> PeerAddress:
    """The handshake address of the producer rank this worker reads from."""
    offset = port_offset(endpoint.dp_rank, source_rank, peer_tp, ctx.pp_rank, ctx.pp_size)
    return PeerAddress(endpoint.host, endpoint.handshake_port + offset)


def release_source(ctx: WorkerContext, endpoint: PeerEndpoint) -> PeerAddress | None:
    """The producer rank whose key checks this rank's releases (None: TP sizes that do not
    pair, where no rank maps to ours)."""
    peer_tp = endpoint.tp_size or ctx.tp_size
    try:
        source = remote_tp_rank(ctx.tp_rank, ctx.tp_size, peer_tp)
    except ValueError:
        return None
    return source_address(ctx, endpoint, source, peer_tp)


def may_release(
    ctx: WorkerContext, endpoint: PeerEndpoint, check: HandoffCheck | None, transfer_id: str
) -> bool:
    """Whether a request that never read its hand-off may free it: only once the hand-off
    verified against the producer's key (that of a generation it retired, too), for this
    request's prompt. A producer not handshaken yet (or another instance now) is not asked:
    it reclaims at its lease."""
    address = release_source(ctx, endpoint)
    if address is None:
        return False
    peer = ctx.peers.connected(address)
    if peer is not None and endpoint.instance_id in (None, peer.instance_id):
        problem = handoff_problem(check, peer)
    elif endpoint.instance_id and (key := ctx.peers.retired_handoff_key(endpoint.instance_id)):
        # The producer slept since (its connection is dropped): its key still checks.
        problem = UNSIGNED if check is None else verify(key, endpoint.instance_id, check)
    else:
        return False
    if problem is None:
        return True
    ctx.counters.handoffs_refused += 1
    kind, reason = problem
    log.warning(
        "release refused: not this request's hand-off",
        transfer_id=transfer_id,
        kind=kind.value,
        reason=reason,
    )
    return False
