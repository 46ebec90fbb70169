"""mori's ``MORI_IO_*`` parsing: ``env::Override`` and the ``mori/utils/env_utils.hpp`` parsers.

An unset or empty variable keeps the configured value; a value the parser rejects is warned
about and ignored (the configured value stays). ``ParsePositiveInt`` rejects 0, negatives and
anything ``strtol`` does not consume whole; ``ParseBool`` knows 1/0, true/false, on/off,
yes/no (any case); ``MORI_IO_POST_BATCH_SIZE`` also takes -1, ``MORI_IO_POLL_CQ_MODE``
0/polling or 1/event.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mori.cpp import PollCqMode, RdmaBackendConfig

INT_MAX = 2**31 - 1
U32_MAX = 2**32 - 1


def _strtol(raw: str) -> int | None:
    """``strtol(raw, &end, 10)`` with ``*end == '\\0'``: leading blanks and a sign allowed."""
    text = raw.lstrip(" \t\n\r\f\v")
    body = text[1:] if text[:1] in "+-" else text
    if not body.isdigit() or not body.isascii():
        return None
    return int(text)


def parse_positive_int(raw: str) -> int | None:
    value = _strtol(raw)
    return value if value is not None and 0 < value <= INT_MAX else None


def parse_positive_u32(raw: str) -> int | None:
    value = _strtol(raw)
    return value if value is not None and 0 < value <= U32_MAX else None


def parse_bool(raw: str) -> bool | None:
    value = raw.lower()
    if raw == "1" or value in ("true", "on", "yes"):
        return True
    if raw == "0" or value in ("false", "off", "no"):
        return False
    return None


def parse_post_batch_size(raw: str) -> int | None:
    return -1 if raw == "-1" else parse_positive_int(raw)


def parse_poll_cq_mode(raw: str) -> PollCqMode | None:
    if raw == "0" or raw.lower() == "polling":
        return PollCqMode.POLLING
    if raw == "1" or raw.lower() == "event":
        return PollCqMode.EVENT
    return None


def override(name: str, current: Any, parse: Callable[[str], Any]) -> Any:
    """``env::Override``: the parsed value of ``name``, or ``current``."""
    raw = os.environ.get(name)
    if not raw:
        return current
    value = parse(raw)
    return current if value is None else value


_BACKEND = (  # RdmaBackend's constructor (src/io/rdma/backend_impl.cpp)
    ("MORI_IO_ENABLE_NOTIFICATION", "enable_notification", parse_bool),
    ("MORI_IO_ENABLE_CHUNKING", "enable_transfer_chunking", parse_bool),
    ("MORI_IO_CHUNK_BYTES", "chunk_bytes", parse_positive_int),
    ("MORI_IO_MAX_CHUNKS", "max_chunks_per_transfer", parse_positive_int),
    ("MORI_IO_NUM_NICS_PER_TRANSFER", "num_nics_per_transfer", parse_positive_int),
    ("MORI_IO_QP_PER_TRANSFER", "qp_per_transfer", parse_positive_int),
    ("MORI_IO_POST_BATCH_SIZE", "post_batch_size", parse_post_batch_size),
    ("MORI_IO_NUM_WORKER_THREADS", "num_worker_threads", parse_positive_int),
    ("MORI_IO_POLL_CQ_MODE", "poll_cq_mode", parse_poll_cq_mode),
)


def effective_config(config: RdmaBackendConfig) -> RdmaBackendConfig:
    """The config after the environment's overrides, as the RDMA backend applies them."""
    out = RdmaBackendConfig()
    out.__dict__.update(config.__dict__)
    for name, field, parse in _BACKEND:
        setattr(out, field, override(name, getattr(out, field), parse))
    return out


def send_queue_depth(config: RdmaBackendConfig, device_max_qp_wr: int) -> int:
    """``RdmaManager::GetRdmaEndpointConfig``: min(env or config or 8192, the device's)."""
    desired = config.max_send_wr if config.max_send_wr > 0 else 8192
    desired = override("MORI_IO_QP_MAX_SEND_WR", desired, parse_positive_u32)
    return int(min(desired, device_max_qp_wr))
