"""Single values of ``kv_transfer_params``, each checked where it enters.

:mod:`moriio.domain.params.transfer_params` assembles them; every failure is a
:class:`TransferParamsError` naming the key.

DP placement (what llm-d's multi-pod fan-out sends): the DP rank ``r`` of a peer spread over
pods of ``remote_dp_size_local`` ranks each lives on ``remote_hosts[r // remote_dp_size_local]``.
moriio offsets a worker's ports by its global DP rank on every pod, so the rank itself is
never folded: only the host changes.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from typing import Any

from moriio.domain.kv.block_groups import BlockGroups
from moriio.domain.values.hosts import InvalidHostError, canonical_host

MAX_PORT = 65535
MAX_DP_SIZE = 1024
MAX_REMOTE_HOSTS = MAX_DP_SIZE  # one pod per DP rank at most
MAX_BLOCK_IDS = 1 << 20
MAX_GROUPS = 64  # KV-cache groups of one request
MAX_LEASE_EXPIRES_AT = 4102444800.0  # 2100-01-01 UTC: a later lease is refused as absurd


class TransferParamsError(ValueError):
    """``kv_transfer_params`` (or the request id) is malformed; the message names the key."""


def flag(params: Mapping[str, Any], key: str) -> bool:
    """A bool key; absent or null is False."""
    value = params.get(key)
    if value is True:
        return True
    if value is False or value is None:
        return False
    raise TransferParamsError(f"kv_transfer_params.{key} must be a bool, got {value!r:.40}")


def port(value: object, key: str) -> int:
    number = value
    if isinstance(number, str) and number.isascii() and number.isdigit() and len(number) <= 5:
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool) or not 0 < number <= MAX_PORT:
        raise TransferParamsError(f"{key} must be a port number 1..{MAX_PORT}, got {value!r:.40}")
    return number


def count(value: object, key: str, minimum: int, maximum: int) -> int:
    if value is None:
        return minimum
    if type(value) is not int or not minimum <= value <= maximum:
        raise TransferParamsError(
            f"kv_transfer_params.{key} must be an int in [{minimum}, {maximum}], got {value!r:.40}"
        )
    return value


def remote_hosts(value: object) -> tuple[str, ...]:
    """``remote_hosts``: the peer's pods in DP order (empty when absent or null)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise TransferParamsError(
            f"kv_transfer_params.remote_hosts must be a list of hosts, got {type(value).__name__}"
        )
    if len(value) > MAX_REMOTE_HOSTS:
        raise TransferParamsError(
            f"kv_transfer_params.remote_hosts has {len(value)} hosts, over {MAX_REMOTE_HOSTS}"
        )
    try:
        return tuple(canonical_host(host) for host in value)
    except InvalidHostError as exc:
        raise TransferParamsError(f"kv_transfer_params.remote_hosts: {exc}") from None


def placement(params: Mapping[str, Any], host: str, dp_rank: int, dp_size: int) -> str:
    """The host serving the peer's DP rank ``dp_rank``; checks the rank against what the
    router can know.

    ``remote_dp_size`` bounds the rank only when it is over 1: vllm-router sends its
    intra-node DP size there (1 by default) next to the global rank a prefill returned.
    With ``remote_hosts`` and ``remote_dp_size_local`` the rank must fall on a listed pod.
    ``remote_dp_rank_override`` (llm-d: the rank is the router's, not ours to choose) is
    checked for its type; moriio always takes ``remote_dp_rank`` as given.
    """
    flag(params, "remote_dp_rank_override")
    if dp_size > 1 and dp_rank >= dp_size:
        raise TransferParamsError(
            f"kv_transfer_params.remote_dp_rank {dp_rank} must be < remote_dp_size {dp_size}"
        )
    local = count(params.get("remote_dp_size_local"), "remote_dp_size_local", 0, MAX_DP_SIZE)
    hosts = remote_hosts(params.get("remote_hosts"))
    if not hosts or not local:
        return host
    pod = dp_rank // local
    if pod >= len(hosts):
        raise TransferParamsError(
            f"kv_transfer_params.remote_dp_rank {dp_rank} lives on pod {pod} "
            f"(remote_dp_size_local {local}), but remote_hosts lists {len(hosts)}"
        )
    return hosts[pod]


def block_ids(value: object) -> BlockGroups | None:
    """One list per KV-cache group (vLLM's hybrid manager), or a flat list (one group)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):  # what JSON and msgpack give: cheap to check
        raise TransferParamsError(
            f"kv_transfer_params.remote_block_ids must be a list, got {type(value).__name__}"
        )
    groups: list[Any] | tuple[Any, ...] = (
        value if value and isinstance(value[0], (list, tuple)) else (value,)
    )
    if len(groups) > MAX_GROUPS:
        raise TransferParamsError(
            f"kv_transfer_params.remote_block_ids has {len(groups)} KV-cache groups, "
            f"over {MAX_GROUPS}"
        )
    total = 0
    for group in groups:
        if not isinstance(group, (list, tuple)):
            raise TransferParamsError(
                "kv_transfer_params.remote_block_ids must be a list of ints or of lists "
                f"(one per KV-cache group), got {group!r:.80} among lists"
            )
        total += len(group)
        if total > MAX_BLOCK_IDS:
            raise TransferParamsError(
                f"kv_transfer_params.remote_block_ids has over {MAX_BLOCK_IDS} ids"
            )
        # C-level passes: an unsigned 64-bit array refuses floats, strings, None and
        # negative or huge ints. A bool enters it as 0 or 1, whose 8 bytes hold 7 zero
        # bytes in a row: the types are looked at one by one only when the array's bytes
        # hold such a run and a 0 or a 1 is among the values. The planner checks every id
        # against the peer's block count before any transfer.
        try:
            if isinstance(group, list):
                ids = _NO_IDS.__copy__()  # cheaper than array("Q", group): no arguments parsed
                ids.fromlist(group)
            else:
                ids = array("Q", group)
            image = ids.tobytes()
        except (TypeError, OverflowError):
            image = None
        if image is None or (
            image.partition(_SEVEN_ZEROS)[1]  # no arguments parsed, nothing copied if absent
            and not _BOOL_VALUES.isdisjoint(group)
            and any(type(v) is bool for v in group)
        ):
            raise TransferParamsError(
                "kv_transfer_params.remote_block_ids must hold non-negative ints, "
                f"got {group!r:.200}"
            )
    return (tuple(groups[0]),) if len(groups) == 1 else tuple(map(tuple, groups))


_BOOL_VALUES = frozenset((0, 1))  # what a bool equals
_SEVEN_ZEROS = bytes(7)
_NO_IDS = array("Q")


def lease(params: Mapping[str, Any]) -> float | None:
    """``lease_expires_at``: wall-clock seconds since the epoch, finite and plausible."""
    value = params.get("lease_expires_at")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TransferParamsError(
            f"kv_transfer_params.lease_expires_at must be a finite number, got {value!r:.40}"
        )
    if not 0 < value <= MAX_LEASE_EXPIRES_AT:
        raise TransferParamsError(
            "kv_transfer_params.lease_expires_at must be wall-clock seconds since the epoch "
            f"in (0, {MAX_LEASE_EXPIRES_AT:.0f}], got {value!r}"
        )
    return float(value)
