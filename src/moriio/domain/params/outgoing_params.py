"""The ``kv_transfer_params`` moriio writes: a producer's return and a router's two legs.

:mod:`moriio.domain.params.transfer_params` parses all of them. The keys and values are a
contract with llm-d, vllm-router and vLLM's toy proxies: routers copy what a producer returns
into the decode request, so its peer address, sizes and rank travel under the ``remote_*``
keys the consumer reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moriio.domain.kv.block_groups import AnyBlockIds, group_lists
from moriio.domain.params.transfer_params import with_token
from moriio.domain.values.addresses import ControlAddress


class ReturnedParams:
    """What a producer returns for its decode engine, one dict per hand-off.

    ``dp_rank`` is the producer's global DP rank, ``dp_size_local`` its DP ranks per node
    (0: unknown); ``instance_id`` its incarnation (see
    :class:`moriio.domain.params.transfer_params.PeerEndpoint`).
    """

    def __init__(
        self,
        *,
        engine_id: str,
        host: str,
        handshake_port: int,
        notify_port: int,
        tp_size: int,
        dp_size: int,
        dp_rank: int,
        dp_size_local: int,
        instance_id: str,
    ) -> None:
        self._token_prefix = with_token(engine_id, "")  # + the token: one concatenation
        self._template: dict[str, Any] = {  # what every hand-off shares
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": engine_id,
            "remote_host": host,
            "remote_handshake_port": handshake_port,
            "remote_notify_port": notify_port,
            "remote_dp_size": dp_size,
            "remote_dp_rank": dp_rank,
            # llm-d pins the decode leg to the rank the prefill returns, as vLLM's in-tree
            # connector returns it.
            "remote_dp_rank_override": True,
            "remote_dp_size_local": dp_size_local,
            "tp_size": tp_size,
            "remote_tp_size": tp_size,
            "remote_instance_id": instance_id,
        }

    def set_generation(self, generation: int) -> None:
        """Name ``generation`` as the registration generation of every hand-off's blocks
        (``remote_registration_generation``) from now on."""
        self._template["remote_registration_generation"] = generation

    def for_transfer(
        self,
        transfer_id: str,
        block_ids: AnyBlockIds,
        lease_expires_at: float,
        token: str | None = None,
    ) -> dict[str, Any]:
        """The params of one hand-off; ``token`` (READ: with its signature) rides in
        ``remote_engine_id``."""
        params = self._template.copy()
        if token is not None:
            params["remote_engine_id"] = self._token_prefix + token
        params["transfer_id"] = transfer_id
        # One list per group (the engine's own lists, fresh for this hand-off, as they come).
        params["remote_block_ids"] = [
            group if type(group) is list else list(group) for group in group_lists(block_ids)
        ]
        params["lease_expires_at"] = lease_expires_at
        return params


def prefill_leg_params(
    transfer_id: str, decode: ControlAddress, *, dp_size: int, dp_rank: int, tp_size: int
) -> dict[str, Any]:
    """What a router sends a prefill: keep the KV for ``decode`` (its DP size, the DP rank
    the request runs on there, where a WRITE pushes, and its TP size)."""
    return {
        "transfer_id": transfer_id,
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_host": decode.host,
        "remote_handshake_port": decode.handshake_port,
        "remote_notify_port": decode.notify_port,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_dp_size": dp_size,
        "remote_dp_rank": dp_rank,
        "remote_tp_size": tp_size,
    }


def decode_leg_params(
    transfer_id: str,
    returned: Mapping[str, Any] | None,
    prefill: ControlAddress,
    *,
    dp_size: int,
    dp_rank: int,
    tp_size: int,
) -> dict[str, Any]:
    """What a router sends a decode: every field the prefill ``returned`` (None in WRITE,
    where both legs start together), with the prefill's address where it returned none and
    ``dp_rank`` unless it returned the rank it ran on."""
    params: dict[str, Any] = dict(returned or {})
    params.update(
        {
            "transfer_id": transfer_id,
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "remote_host": params.get("remote_host") or prefill.host,
            "remote_handshake_port": params.get("remote_handshake_port") or prefill.handshake_port,
            "remote_notify_port": params.get("remote_notify_port") or prefill.notify_port,
            "remote_dp_size": dp_size,
            "remote_tp_size": tp_size,
        }
    )
    params.setdefault("remote_dp_rank", dp_rank)
    params.setdefault("remote_engine_id", None)
    params.setdefault("remote_block_ids", None)
    return params
