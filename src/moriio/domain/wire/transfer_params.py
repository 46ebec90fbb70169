"""The ``kv_transfer_params`` contract shared with vLLM's MoRIIO toy proxy and vllm-router.

Peers find each other through ``kv_transfer_params`` (explicit keys win) or through control
addresses embedded in the request id by the router::

    ___prefill_addr_host:IP,handshake:PORT,notify:PORT___decode_addr_host:...,notify:PORT_<32 hex>

Every value is validated here, where it enters: types, ranges (ports, ranks and TP/DP sizes
up to :data:`MAX_TP_SIZE` / :data:`MAX_DP_SIZE`), host syntax (the canonical spelling of
:func:`moriio.domain.wire.hosts.canonical_host` is what is later checked against the trust list
and dialled) and id lengths. Anything else raises :class:`TransferParamsError` naming the
key; callers run such a request without a transfer.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from typing import Any, NamedTuple

from moriio.domain.wire.capability import is_token
from moriio.domain.wire.hosts import InvalidHostError, canonical_host
from moriio.domain.wire.request_ids import (
    peer_address_from_request_id,
    transfer_id_from_request_id,
)

MAX_PORT = 65535
MAX_INSTANCE_ID_LEN = 256  # an engine or worker instance id, in params and on the wire
MAX_ENGINE_ID_LEN = 256
MAX_TRANSFER_ID_LEN = 1024  # in params and on the wire
MAX_TP_SIZE = 1024  # remote TP size (and so release fan-out) accepted from params
MAX_DP_SIZE = 1024
MAX_BLOCK_IDS = 1 << 20
MAX_LEASE_EXPIRES_AT = 4102444800.0  # 2100-01-01 UTC: a later lease is refused as absurd
TOKEN_SEPARATOR = "#"


class TransferParamsError(ValueError):
    """``kv_transfer_params`` (or the request id) is malformed; the message names the key."""


class PeerEndpoint(NamedTuple):
    """Control-plane location of a remote engine (its rank-0 worker ports are the bases).

    ``instance_id``: the engine instance that minted the params (it changes on every
    restart). None when the params do not say: accepted only until the peer's address is
    seen to restart (see :meth:`moriio.domain.worker.peers.PeerDirectory.connect`).
    """

    host: str
    handshake_port: int
    notify_port: int
    tp_size: int = 0  # 0 = unknown: assume the same TP size as ours
    dp_size: int = 1
    dp_rank: int = 0
    engine_id: str | None = None
    instance_id: str | None = None


class TransferParams(NamedTuple):
    """What one request's ``kv_transfer_params`` say about its transfer."""

    transfer_id: str
    do_remote_prefill: bool
    do_remote_decode: bool
    remote_block_ids: tuple[int, ...] | None
    peer: PeerEndpoint | None
    lease_expires_at: float | None = None  # producer wall-clock seconds; None = no lease
    token: str | None = None  # the producer's capability for this transfer (see below)


def with_token(engine_id: str, token: str) -> str:
    """The ``remote_engine_id`` a producer returns: its engine id plus the transfer's token.

    Routers copy only ``remote_engine_id``, ``remote_block_ids`` and ``transfer_id`` from a
    prefill's answer into the decode request, so the capability rides in the engine id.
    """
    return f"{engine_id}{TOKEN_SEPARATOR}{token}"


def parse_zmq_address(address: str) -> tuple[str, int, int]:
    """``"host:IP,handshake:PORT,notify:PORT"`` -> (host, handshake_port, notify_port).

    Each segment is split on its first colon, so IPv6 hosts survive.
    """
    fields: dict[str, str] = {}
    for segment in address.split(","):
        key, sep, value = segment.partition(":")
        if not sep:
            raise TransferParamsError(f"malformed peer address segment {segment!r} in {address!r}")
        fields[key.strip()] = value.strip()
    missing = [k for k in ("host", "handshake", "notify") if not fields.get(k)]
    if missing:
        raise TransferParamsError(f"peer address {address!r} lacks {', '.join(missing)}")
    return (
        fields["host"],
        _port(fields["handshake"], "handshake"),
        _port(fields["notify"], "notify"),
    )


def format_zmq_address(host: str, handshake_port: int, notify_port: int) -> str:
    """Inverse of :func:`parse_zmq_address`."""
    return f"host:{host},handshake:{handshake_port},notify:{notify_port}"


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
    if not isinstance(params, Mapping):
        raise TransferParamsError(
            f"kv_transfer_params must be a mapping, got {type(params).__name__}"
        )
    try:
        return _parse(params, request_id, producer_peer, consumer)
    except TransferParamsError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        # A shape no check above foresaw: still the client's fault, never the engine's.
        raise TransferParamsError(
            f"malformed kv_transfer_params: {type(exc).__name__}: {exc}"
        ) from None


def _parse(
    params: Mapping[str, Any], request_id: str, producer_peer: bool, consumer: bool
) -> TransferParams | None:
    do_remote_prefill = _flag(params, "do_remote_prefill")
    do_remote_decode = _flag(params, "do_remote_decode")
    if not (do_remote_prefill or do_remote_decode):
        return None
    transfer_id = params.get("transfer_id")
    if transfer_id is None:
        transfer_id = transfer_id_from_request_id(request_id)
    if not isinstance(transfer_id, str) or not 0 < len(transfer_id) <= MAX_TRANSFER_ID_LEN:
        raise TransferParamsError(
            f"kv_transfer_params.transfer_id must be a string of 1..{MAX_TRANSFER_ID_LEN} "
            f"chars, got {transfer_id!r:.80}"
        )
    wants_peer = producer_peer if do_remote_decode else consumer
    if not (wants_peer or consumer):
        return TransferParams(transfer_id, do_remote_prefill, do_remote_decode, None, None)
    engine_id, token = _engine_id(params.get("remote_engine_id"))
    peer = (
        _peer(params, request_id, engine_id, is_producer=do_remote_decode) if wants_peer else None
    )
    if not consumer:
        return TransferParams(transfer_id, do_remote_prefill, do_remote_decode, None, peer)
    block_ids = _block_ids(params.get("remote_block_ids"))
    lease = None if params.get("lease_expires_at") is None else _lease(params)
    return TransferParams(
        transfer_id, do_remote_prefill, do_remote_decode, block_ids, peer, lease, token
    )


def _engine_id(value: object) -> tuple[str | None, str | None]:
    """``remote_engine_id`` split into the engine id and the transfer token it may carry."""
    if value is None:
        return None, None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ENGINE_ID_LEN:
        raise TransferParamsError(
            "kv_transfer_params.remote_engine_id must be a string of 1.."
            f"{MAX_ENGINE_ID_LEN} chars or null, got {value!r:.80}"
        )
    engine_id, sep, token = value.rpartition(TOKEN_SEPARATOR)
    if not sep:
        return value, None
    if not engine_id or not is_token(token):
        raise TransferParamsError(
            "kv_transfer_params.remote_engine_id carries a malformed transfer token "
            f"(expected <engine id>#<32 hex digits>), got {value!r:.80}"
        )
    return engine_id, token


_PEER_CACHE_SIZE = 4096
_peer_cache: dict[tuple[object, ...], PeerEndpoint] = {}


def _peer(
    params: Mapping[str, Any], request_id: str, engine_id: str | None, *, is_producer: bool
) -> PeerEndpoint | None:
    host = params.get("remote_host")
    handshake = params.get("remote_handshake_port")
    notify = params.get("remote_notify_port")
    embedded = None
    if not host or handshake is None or notify is None:  # explicit keys win: skip the search
        embedded = peer_address_from_request_id(request_id, want_decode=is_producer)
    key = (
        host,
        handshake,
        notify,
        embedded,
        params.get("remote_tp_size", params.get("tp_size", 0)),
        params.get("remote_dp_size", 1),
        params.get("remote_dp_rank", 0),
        engine_id,
        params.get("remote_instance_id"),
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
        e_host, e_handshake, e_notify = parse_zmq_address(embedded)
        host = host or e_host
        handshake = handshake if handshake is not None else e_handshake
        notify = notify if notify is not None else e_notify
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
    peer = PeerEndpoint(
        host=host,
        handshake_port=_port(handshake, "remote_handshake_port"),
        notify_port=_port(notify, "remote_notify_port"),
        tp_size=_count(tp_size, "remote_tp_size", 0, MAX_TP_SIZE),
        dp_size=_count(params.get("remote_dp_size", 1), "remote_dp_size", 1, MAX_DP_SIZE),
        dp_rank=_count(params.get("remote_dp_rank", 0), "remote_dp_rank", 0, MAX_DP_SIZE - 1),
        engine_id=engine_id,
        instance_id=instance_id,
    )
    if peer.dp_rank >= peer.dp_size:
        raise TransferParamsError(
            f"kv_transfer_params.remote_dp_rank {peer.dp_rank} must be < remote_dp_size "
            f"{peer.dp_size}"
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


def _flag(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key)
    if value is True:
        return True
    if value is False or value is None:
        return False
    raise TransferParamsError(f"kv_transfer_params.{key} must be a bool, got {value!r}")


def _block_ids(value: object) -> tuple[int, ...] | None:
    """Flat list, or one list per KV-cache group (only a single group is supported)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):  # what JSON and msgpack give: cheap to check
        raise TransferParamsError(
            f"kv_transfer_params.remote_block_ids must be a list, got {type(value).__name__}"
        )
    flat: list[Any] | tuple[Any, ...] = value
    first = value[0] if value else None
    if isinstance(first, list | tuple):
        if len(value) != 1:
            raise TransferParamsError(
                "kv_transfer_params.remote_block_ids has "
                f"{len(value)} KV-cache groups; only one group is supported"
            )
        flat = first
    if len(flat) > MAX_BLOCK_IDS:
        raise TransferParamsError(
            f"kv_transfer_params.remote_block_ids has {len(flat)} ids, over {MAX_BLOCK_IDS}"
        )
    if flat and not _non_negative_ints(flat):
        raise TransferParamsError(
            f"kv_transfer_params.remote_block_ids must hold non-negative ints, got {flat!r:.200}"
        )
    return tuple(flat)


def _non_negative_ints(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every value is an int in [0, 2**64) and none is a bool.

    C-level passes on the per-request hot path: an unsigned 64-bit array refuses floats,
    strings, None and negative or huge ints; a bool enters it as 0 or 1, so the types are
    looked at one by one only when a 0 or a 1 is among the values. The planner checks every
    id against the peer's block count before any transfer.
    """
    try:
        array("Q", values)
    except (TypeError, OverflowError):
        return False
    if _BOOL_VALUES.isdisjoint(values):
        return True
    return not any(type(value) is bool for value in values)


_BOOL_VALUES = frozenset((0, 1))  # what a bool equals


def _port(value: object, key: str) -> int:
    port = value
    if isinstance(port, str) and port.isascii() and port.isdigit() and len(port) <= 5:
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port <= MAX_PORT:
        raise TransferParamsError(f"{key} must be a port number 1..{MAX_PORT}, got {value!r}")
    return port


def _count(value: object, key: str, minimum: int, maximum: int) -> int:
    if value is None:
        return minimum
    if type(value) is not int or not minimum <= value <= maximum:
        raise TransferParamsError(
            f"kv_transfer_params.{key} must be an int in [{minimum}, {maximum}], got {value!r:.40}"
        )
    return value


def _optional_float(params: Mapping[str, Any], key: str) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TransferParamsError(
            f"kv_transfer_params.{key} must be a finite number, got {value!r:.40}"
        )
    return float(value)


def _lease(params: Mapping[str, Any]) -> float | None:
    """``lease_expires_at``: wall-clock seconds since the epoch, finite and plausible."""
    lease = _optional_float(params, "lease_expires_at")
    if lease is not None and not 0 < lease <= MAX_LEASE_EXPIRES_AT:
        raise TransferParamsError(
            "kv_transfer_params.lease_expires_at must be wall-clock seconds since the epoch "
            f"in (0, {MAX_LEASE_EXPIRES_AT:.0f}], got {lease!r}"
        )
    return lease


def port_offset(dp_rank: int, tp_rank: int, tp_size: int) -> int:
    """Offset of a worker's ports from its engine's base ports: ``dp_rank * tp_size + tp_rank``.

    Listeners and dialers use the same stride, so DP > 1 with TP > 1 neither collides nor
    misroutes.
    """
    return dp_rank * tp_size + tp_rank
