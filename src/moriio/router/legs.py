"""What the router sends each leg: the request id, and the prefill's and the decode's bodies.

Each leg's ``kv_transfer_params`` are the router's: a client's (top-level, or under
``vllm_xargs``, which vLLM also reads them from) never reach an engine.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from moriio.domain.params.outgoing_params import decode_leg_params, prefill_leg_params
from moriio.domain.params.request_ids import request_id_with_addresses
from moriio.router.registry import Instance


def request_id(prefill: Instance, decode: Instance, transfer_id: str) -> str:
    """The id both engines see: the toy proxy's format, carrying both control addresses."""
    return request_id_with_addresses(prefill.control, decode.control, transfer_id)


def client_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client's request without any ``kv_transfer_params`` it carries."""
    out = copy.deepcopy(dict(body))
    out.pop("kv_transfer_params", None)
    extra = out.get("vllm_xargs")
    if isinstance(extra, dict):
        extra.pop("kv_transfer_params", None)
    return out


def one_token_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client's request for the prefill leg: one token, not streamed."""
    out = client_body(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    return out


def prefill_body(
    body: Mapping[str, Any], decode: Instance, transfer_id: str, decode_rank: int = 0
) -> dict[str, Any]:
    """The prefill leg; ``decode_rank``: the decode's DP rank (where a WRITE pushes)."""
    out = one_token_body(body)
    out["kv_transfer_params"] = prefill_leg_params(
        transfer_id,
        decode.control,
        dp_size=decode.dp_size,
        dp_rank=decode_rank,
        tp_size=decode.tp_size,
    )
    return out


def decode_body(
    body: Mapping[str, Any],
    prefill: Instance,
    transfer_id: str,
    returned: Mapping[str, Any] | None,
    prefill_rank: int = 0,
) -> dict[str, Any]:
    """The decode leg; ``prefill_rank``: the prefill's DP rank, unless the prefill returned
    the one it ran on (READ)."""
    out = client_body(body)
    out["kv_transfer_params"] = decode_leg_params(
        transfer_id,
        returned,
        prefill.control,
        dp_size=prefill.dp_size,
        dp_rank=prefill_rank,
        tp_size=prefill.tp_size,
    )
    return out
