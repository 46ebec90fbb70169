"""A decode request's parsed READ parameters for given producer block lists."""

from __future__ import annotations

from collections.abc import Sequence

from moriio.domain.params.transfer_params import TransferParams, parse_transfer_params


def read_params(remote: Sequence[Sequence[int]], request_id: str = "r") -> TransferParams:
    """``remote``: the producer's block list per KV-cache group."""
    params = parse_transfer_params(
        {
            "do_remote_prefill": True,
            "transfer_id": "t",
            "remote_engine_id": "p",
            "remote_host": "10.0.0.1",
            "remote_handshake_port": 7000,
            "remote_notify_port": 7001,
            "remote_block_ids": [list(group) for group in remote],
        },
        request_id,
    )
    assert params is not None
    return params
