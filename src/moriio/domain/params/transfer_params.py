"""The ``kv_transfer_params`` contract shared with vLLM's MoRIIO toy proxy, vllm-router and
llm-d's routing sidecar.

Peers find each other through ``kv_transfer_params`` (explicit keys win) or through control
addresses (:mod:`moriio.domain.values.addresses`) embedded in the request id by the router::

    ___prefill_addr_host:IP,handshake:PORT,notify:PORT___decode_addr_host:...,notify:PORT_<32 hex>

Every value is validated here, where it enters: types, ranges (ports, ranks and TP/DP sizes
up to :data:`MAX_TP_SIZE` / :data:`MAX_DP_SIZE`), host syntax (the canonical spelling of
:func:`moriio.domain.values.hosts.canonical_host` is what is later checked against the trust list
and dialled) and id lengths. Anything else raises :class:`TransferParamsError` naming the
key; callers run such a request without a transfer.

llm-d also sends ``remote_hosts``, ``remote_dp_size_local`` and ``remote_dp_rank_override``
(see :func:`moriio.domain.params.param_values.placement`); its plain nixlv2 path sends no
``transfer_id``, so a producer names the transfer ``sidecar-<request id>`` and returns it.
What moriio itself writes is built in :mod:`moriio.domain.params.outgoing_params`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from moriio.domain.kv.block_groups import BlockGroups
from moriio.domain.params import param_values as pv
from moriio.domain.params.handoff_tags import (
    MAX_SIGNATURE_LEN,
    HandoffSignature,
    parse_signed_token,
)
from moriio.domain.params.param_values import MAX_DP_SIZE, MAX_PORT
from moriio.domain.params.request_ids import (
    peer_address_from_request_id,
    transfer_id_from_request_id,
)
from moriio.domain.values.addresses import ControlAddress, ControlAddressError
from moriio.domain.values.hosts import InvalidHostError, canonical_host

MAX_INSTANCE_ID_LEN = 256  # an engine or worker instance id, in params and on the wire
MAX_GENERATION = (1 << 31) - 1  # a registration generation, in params and on the wire
MAX_ENGINE_ID_LEN = 256
MAX_REMOTE_ENGINE_ID_LEN = MAX_ENGINE_ID_LEN + 1 + MAX_SIGNATURE_LEN  # with a signed token
MAX_TRANSFER_ID_LEN = 1024  # in params and on the wire
MAX_TP_SIZE = 1024  # remote TP size (and so release fan-out) accepted from params
TOKEN_SEPARATOR = "#"
TransferParamsError = pv.TransferParamsError
DERIVED_TRANSFER_ID_PREFIX = "sidecar-"  # + request id, where no router named the transfer


class PeerEndpoint(NamedTuple):
    """Control-plane location of a remote engine (its rank-0 worker ports are the bases).

    ``instance_id``: the engine instance that minted the params (it changes on every
    restart). None when the params do not say: accepted only until the peer's address is
    seen to restart (see :meth:`moriio.domain.worker.peers.PeerDirectory.connect`).
    ``generation``: the registration generation the blocks lie in
    (``remote_registration_generation``; see :mod:`moriio.domain.worker.generations`).
    None when the params do not say: accepted only while the peer never registered again.
    """

    host: str
    handshake_port: int
    notify_port: int
    tp_size: int = 0  # 0 = unknown: assume the same TP size as ours
    dp_size: int = 1
    dp_rank: int = 0
    engine_id: str | None = None
    instance_id: str | None = None
    generation: int | None = None


class TransferParams(NamedTuple):
    """What one request's ``kv_transfer_params`` say about its transfer."""

    transfer_id: str
    do_remote_prefill: bool
    do_remote_decode: bool
    remote_block_ids: BlockGroups | None  # one tuple per KV-cache group
    peer: PeerEndpoint | None
    lease_expires_at: float | None = None  # producer wall-clock seconds; None = no lease
    token: str | None = None  # the producer's capability for this transfer (see below)
    # The producer's signature of the hand-off (READ; see moriio.domain.params.handoff_tags).
    # Its lease is the one ``lease_expires_at`` holds: the signed one wins.
    signature: HandoffSignature | None = None


def with_token(engine_id: str, token: str) -> str:
    """The ``remote_engine_id`` a producer returns: its engine id plus the transfer's token.

    Routers copy only ``remote_engine_id``, ``remote_block_ids`` and ``transfer_id`` from a
    prefill's answer into the decode request, so the capability rides in the engine id (a
    READ producer's is its hand-off's signature, :meth:`HandoffSignature.text`, whose check
    tag is the token).
    """
    return f"{engine_id}{TOKEN_SEPARATOR}{token}"


def parse_transfer_params(
    params: Mapping[str, Any] | None,
    request_id: str,
    *,
    producer_peer: bool = True,
    consumer: bool = True,
) -> TransferParams | None:
    """Typed view of a request's params; None when the request takes no part in P/D.

    A producer (``do_remote_decode``) looks for the decode peer's address, a consumer
    (``do_remote_prefill``) for the prefill peer's. ``producer_peer=False`` skips the decode
    peer of a producer that never contacts it (READ mode); ``consumer=False`` skips what only
    a consumer reads (the prefill peer, block ids, lease and token) on an engine that never
    loads: each engine validates exactly the fields it acts on.
    """
    if not params:
        return None
    if type(params) is not dict and not isinstance(params, Mapping):
        raise TransferParamsError(
            f"kv_transfer_params must be a mapping, got {type(params).__name__}"
        )
    # One frame for the common path: every request is parsed once, rarely with warm caches.
    try:
        do_remote_prefill = params.get("do_remote_prefill")
        if type(do_remote_prefill) is not bool:
            do_remote_prefill = pv.flag(params, "do_remote_prefill")
        do_remote_decode = params.get("do_remote_decode")
        if type(do_remote_decode) is not bool:
            do_remote_decode = pv.flag(params, "do_remote_decode")
        if not (do_remote_prefill or do_remote_decode):
            return None
        transfer_id = params.get("transfer_id")
        if transfer_id is None:
            transfer_id = _derived_transfer_id(request_id, do_remote_decode)
        if type(transfer_id) is not str or not 0 < len(transfer_id) <= MAX_TRANSFER_ID_LEN:
            transfer_id = _check_transfer_id(transfer_id)
        wants_peer = producer_peer if do_remote_decode else consumer
        if not (wants_peer or consumer):
            return TransferParams(transfer_id, do_remote_prefill, do_remote_decode, None, None)
        engine_id = params.get("remote_engine_id")
        token = signature = None
        if engine_id is not None and not (
            type(engine_id) is str
            and 0 < len(engine_id) <= MAX_ENGINE_ID_LEN
            and TOKEN_SEPARATOR not in engine_id
        ):
            engine_id, token, signature = _engine_id(engine_id)  # a token to split off
        peer = _peer(params, request_id, engine_id, do_remote_decode) if wants_peer else None
        if not consumer:
            return TransferParams(transfer_id, do_remote_prefill, do_remote_decode, None, peer)
        block_ids = pv.block_ids(params.get("remote_block_ids"))
        lease = None if params.get("lease_expires_at") is None else pv.lease(params)
        if signature is not None:
            lease = signature.lease_expires_at
        return TransferParams(
            transfer_id,
            do_remote_prefill,
            do_remote_decode,
            block_ids,
            peer,
            lease,
            token,
            signature,
        )
    except TransferParamsError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        # A shape no check above foresaw: still the client's fault, never the engine's.
        raise TransferParamsError(
            f"malformed kv_transfer_params: {type(exc).__name__}: {exc}"
        ) from None


def _derived_transfer_id(request_id: str, do_remote_decode: bool) -> str | None:
    """The transfer id of params that name none: the router's, embedded in the request id."""
    transfer_id = transfer_id_from_request_id(request_id)
    if transfer_id is None and do_remote_decode:
        # llm-d's plain nixlv2 sends none: the producer names the transfer, as vLLM's
        # in-tree connector does, and returns the name with its params.
        transfer_id = f"{DERIVED_TRANSFER_ID_PREFIX}{request_id}"
    return transfer_id


def _check_transfer_id(transfer_id: object) -> str:
    if not isinstance(transfer_id, str) or not 0 < len(transfer_id) <= MAX_TRANSFER_ID_LEN:
        raise TransferParamsError(
            f"kv_transfer_params.transfer_id must be a string of 1..{MAX_TRANSFER_ID_LEN} "
            f"chars, got {transfer_id!r:.80}"
        )
    return transfer_id


def _engine_id(value: object) -> tuple[str, str | None, HandoffSignature | None]:
    """``remote_engine_id`` split into the engine id and the transfer token (and signature)
    it may carry."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REMOTE_ENGINE_ID_LEN:
        raise TransferParamsError(
            "kv_transfer_params.remote_engine_id must be a string of 1.."
            f"{MAX_REMOTE_ENGINE_ID_LEN} chars or null, got {value!r:.80}"
        )
    engine_id, sep, signed = value.rpartition(TOKEN_SEPARATOR)
    if not sep:
        if len(value) > MAX_ENGINE_ID_LEN:
            raise TransferParamsError(
                f"kv_transfer_params.remote_engine_id: an engine id of {len(value)} chars, "
                f"over {MAX_ENGINE_ID_LEN}"
            )
        return value, None, None
    parsed = parse_signed_token(signed)
    if not engine_id or len(engine_id) > MAX_ENGINE_ID_LEN or parsed is None:
        raise TransferParamsError(
            "kv_transfer_params.remote_engine_id carries a malformed transfer token "
            "(expected <engine id>#<32 hex digits>[.<lease ms>.<tokens>.<scheme>.<tag>]), got "
            f"{value!r:.80}"
        )
    return engine_id, *parsed


_PEER_CACHE_SIZE = 4096
_peer_cache: dict[tuple[object, ...], PeerEndpoint] = {}
_ABSENT = object()  # a key the params lack (``remote_tp_size``: null and absent differ)


def _peer(
    params: Mapping[str, Any], request_id: str, engine_id: str | None, is_producer: bool
) -> PeerEndpoint | None:
    host = params.get("remote_host")
    handshake = params.get("remote_handshake_port")
    notify = params.get("remote_notify_port")
    embedded = None
    if not host or handshake is None or notify is None:  # explicit keys win: skip the search
        embedded = peer_address_from_request_id(request_id, want_decode=is_producer)
    tp = params.get("remote_tp_size", _ABSENT)  # only an absent one falls back to tp_size
    tp_size = params.get("tp_size")
    dp = params.get("remote_dp_size")
    rank = params.get("remote_dp_rank")
    instance = params.get("remote_instance_id")
    generation = params.get("remote_registration_generation")
    local = params.get("remote_dp_size_local")
    override = params.get("remote_dp_rank_override")
    hosts = params.get("remote_hosts")
    if isinstance(hosts, list):
        hosts = tuple(hosts)
    # Every value the peer is built from, and its type: True == 1 and 1 == 1.0, but equal
    # values of other types differ.
    key = (
        embedded,
        engine_id,
        host,
        handshake,
        notify,
        tp,
        tp_size,
        dp,
        rank,
        instance,
        generation,
        local,
        override,
        hosts,
        type(engine_id),
        type(host),
        type(handshake),
        type(notify),
        type(tp),
        type(tp_size),
        type(dp),
        type(rank),
        type(instance),
        type(generation),
        type(local),
        type(override),
        type(hosts),
    )
    try:
        cached = _peer_cache.get(key)
        hashable = True
    except TypeError:  # an unhashable value: validation below names it
        cached, hashable = None, False
    if cached is not None:
        return cached
    peer = _build_peer(params, host, handshake, notify, embedded, engine_id)
    if peer is not None and hashable:
        if len(_peer_cache) >= _PEER_CACHE_SIZE:
            _peer_cache.clear()
        _peer_cache[key] = peer
    return peer


def _build_peer(
    params: Mapping[str, Any],
    host: object,
    handshake: object,
    notify: object,
    embedded: str | None,
    engine_id: str | None,
) -> PeerEndpoint | None:
    if embedded is not None:
        address = _embedded_address(embedded)
        host = host or address.host
        handshake = handshake if handshake is not None else address.handshake_port
        notify = notify if notify is not None else address.notify_port
    if not host and handshake is None and notify is None:
        return None
    try:
        host = canonical_host(host)
    except InvalidHostError as exc:
        raise TransferParamsError(f"kv_transfer_params.remote_host: {exc}") from None
    tp_size = params.get("remote_tp_size", params.get("tp_size", 0))
    instance_id = params.get("remote_instance_id")
    if instance_id is not None and (
        not isinstance(instance_id, str) or not 0 < len(instance_id) <= MAX_INSTANCE_ID_LEN
    ):
        raise TransferParamsError(
            "kv_transfer_params.remote_instance_id must be a string of 1.."
            f"{MAX_INSTANCE_ID_LEN} chars, got {instance_id!r:.80}"
        )
    dp_size = pv.count(params.get("remote_dp_size", 1), "remote_dp_size", 1, MAX_DP_SIZE)
    dp_rank = pv.count(params.get("remote_dp_rank", 0), "remote_dp_rank", 0, MAX_DP_SIZE - 1)
    peer = PeerEndpoint(
        host=pv.placement(params, host, dp_rank, dp_size),
        handshake_port=pv.port(handshake, "remote_handshake_port"),
        notify_port=pv.port(notify, "remote_notify_port"),
        tp_size=pv.count(tp_size, "remote_tp_size", 0, MAX_TP_SIZE),
        dp_size=dp_size,
        dp_rank=dp_rank,
        engine_id=engine_id,
        instance_id=instance_id,
        generation=_generation(params.get("remote_registration_generation")),
    )
    # The highest port any rank of the peer's DP rank listens on must still be a port.
    span = port_offset(peer.dp_rank, max(peer.tp_size, 1) - 1, max(peer.tp_size, 1))
    for key, base in (
        ("remote_handshake_port", peer.handshake_port),
        ("remote_notify_port", peer.notify_port),
    ):
        if base + span > MAX_PORT:
            raise TransferParamsError(
                f"kv_transfer_params.{key} {base} + rank offset {span} (remote_dp_rank "
                f"{peer.dp_rank}, remote_tp_size {peer.tp_size}) exceeds port {MAX_PORT}"
            )
    return peer


_EMBEDDED_KEYS = {
    "host": "remote_host",
    "handshake": "remote_handshake_port",
    "notify": "remote_notify_port",
}


def _embedded_address(text: str) -> ControlAddress:
    """The peer address a router embedded in the request id; errors name the key it stands for."""
    try:
        return ControlAddress.parse(text)
    except ControlAddressError as exc:
        key = _EMBEDDED_KEYS.get(exc.part)
        where = f"kv_transfer_params.{key}" if key else "kv_transfer_params"
        raise TransferParamsError(
            f"{where}, from the address embedded in the request id: {exc}"
        ) from None


def port_offset(
    dp_rank: int, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1
) -> int:
    """Offset of a worker's ports from its engine's base ports:
    ``(dp_rank * pp_size + pp_rank) * tp_size + tp_rank`` (``dp_rank * tp_size + tp_rank``
    without pipeline parallelism).

    Listeners and dialers use the same stride, so DP, PP and TP ranks of one host neither
    collide nor misroute. A dialer uses its own pipeline rank and size: stage ``s`` of one
    engine talks to stage ``s`` of its peer.
    """
    return (dp_rank * pp_size + pp_rank) * tp_size + tp_rank


def _generation(value: object) -> int | None:
    """``remote_registration_generation``: absent, or an int from 1 to 2**31 - 1."""
    if value is None:
        return None
    return pv.count(value, "remote_registration_generation", 1, MAX_GENERATION)
