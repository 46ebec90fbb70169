"""What a P/D proxy puts in ``kv_transfer_params``, the way vLLM's MoRIIO toy proxy does.

Shared by both proxies of the harness (:mod:`support.pd.sim_proxy`,
:mod:`support.pd.process_proxy`): a ``transfer_id`` per request; the prefill runs with
``do_remote_decode``; in WRITE mode each side also gets the other's control address, in READ
mode the decode request carries what the prefill returned.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"
"""Where every engine of the harness listens."""


@dataclass(frozen=True, slots=True)
class Address:
    """Where an engine's connector listens (base ports of its rank 0)."""

    host: str
    handshake_port: int
    notify_port: int


def new_transfer_id() -> str:
    return f"tx-{uuid.uuid4().hex}"


def connector_extra(read_mode: bool, address: Address) -> dict[str, Any]:
    """The engine's ``kv_connector_extra_config`` for NIXL at ``address``."""
    return {
        "read_mode": read_mode,
        "transport": "nixl",
        "host_ip": address.host,
        "handshake_port": address.handshake_port,
        "notify_port": address.notify_port,
    }


def peer_keys(address: Address) -> dict[str, Any]:
    """The keys that point a request at its peer engine."""
    return {
        "remote_host": address.host,
        "remote_handshake_port": address.handshake_port,
        "remote_notify_port": address.notify_port,
        "remote_tp_size": 1,
        "remote_dp_size": 1,
        "remote_dp_rank": 0,
    }


def prefill_params(transfer_id: str, decode: Address | None = None) -> dict[str, Any]:
    """The prefill half's params; ``decode`` (WRITE mode) is where the KV is pushed."""
    params: dict[str, Any] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": transfer_id,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_dp_size": 1,
        "remote_tp_size": 1,
    }
    if decode is not None:
        params.update(peer_keys(decode))
    return params


def write_decode_params(transfer_id: str, prefill: Address | None = None) -> dict[str, Any]:
    """The decode half's params in WRITE mode, dispatched with the prefill half."""
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_dp_size": 1,
        "remote_tp_size": 1,
    }
    if prefill is not None:
        params.update(peer_keys(prefill))
    return params
