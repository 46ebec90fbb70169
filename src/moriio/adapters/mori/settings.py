"""RDMA backend settings as mori will really apply them, and start-up checks.

mori's ``RdmaBackend`` lets ``MORI_IO_*`` environment variables override the
``RdmaBackendConfig`` it is given (``src/io/rdma/backend_impl.cpp``), parsed as
:mod:`~moriio.adapters.mori.envparse` describes: an empty, non-positive or unparsable value is
ignored and the configured value kept. The adapter resolves the same overrides so that it logs,
warns about and reasons on the values mori will use, including the queue pairs' retry budget
(``MORI_IO_QP_TIMEOUT``, ``MORI_IO_QP_RETRY_CNT``), which bounds how long posted work may
still land after a failure.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from moriio.adapters.mori import envparse
from moriio.adapters.mori.nics import CHUNK_BYTES, DEFAULT_SEND_WR, DEFAULTS, NicFamily
from moriio.domain.timing.policy import TransferPolicy
from moriio.log import get_logger
from moriio.ports import MemoryKind

_log = get_logger("moriio.adapters.mori.engine")

DEFAULT_SQ_BACKOFF_US = 5_000_000
"""How long mori's post blocks on a full send queue unless MORI_IO_SQ_BACKOFF_TIMEOUT_US."""
DEFAULT_QP_TIMEOUT = 14  # local ACK timeout exponent: 4.096 us * 2**14 = 67 ms per try
DEFAULT_QP_RETRY_CNT = 7  # the largest value the field holds


@dataclass(frozen=True, slots=True)
class RdmaTuning:
    """The RDMA backend values that change how a batch is posted and when it is quiet."""

    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_worker_threads: int = -1
    poll_cq_event_mode: bool = False
    enable_notification: bool = False
    enable_transfer_chunking: bool = False
    chunk_bytes: int = 65536
    max_chunks_per_transfer: int = 64
    num_nics_per_transfer: int = 1
    max_send_wr: int = DEFAULT_SEND_WR
    send_wr_floor: int = DEFAULT_SEND_WR  # a floor of the device's max_qp_wr
    qp_timeout: int = DEFAULT_QP_TIMEOUT
    qp_retry_count: int = DEFAULT_QP_RETRY_CNT

    @property
    def send_queue_depth(self) -> int:
        """The depth mori gets at least: min(configured, the device's)."""
        return min(self.max_send_wr, self.send_wr_floor)

    def nics_for(self, kind: MemoryKind) -> int:
        """NICs a transfer from ``kind`` memory is striped over: mori forces 1 for GPU memory."""
        return 1 if kind is MemoryKind.DEVICE else self.num_nics_per_transfer

    def inline_posting(self, kind: MemoryKind) -> bool:
        """Whether mori posts a batch from ``kind`` memory on the caller's thread, chain after
        chain (else its worker pool posts each worker's share in parallel)."""
        if self.num_worker_threads <= 1 or self.num_nics_per_transfer > 1:
            return True
        return self.enable_transfer_chunking and kind is MemoryKind.HOST

    def settle_deadline(self, now: float) -> float:
        """When no byte of work left posted at ``now`` can land any more (``math.inf`` with
        ``MORI_IO_QP_TIMEOUT=0``: never, until the engine holding the QPs is destroyed)."""
        return TransferPolicy.rc_settle_deadline(now, self.qp_timeout, self.qp_retry_count)


def configured_tuning(
    family: NicFamily,
    *,
    qp_per_transfer: int | None = None,
    post_batch_size: int = -1,
    num_worker_threads: int | None = None,
    max_send_wr: int | None = None,
    transfer_chunking: bool | None = None,
    poll_cq_event_mode: bool = False,
) -> RdmaTuning:
    """The backend config moriio gives mori on ``family``'s NICs: each value left None comes
    from the family's defaults (:mod:`~moriio.adapters.mori.nics`). Chunking defaults to on
    (with 1 GiB chunks) when posting inline, off with mori's worker pool."""
    defaults = DEFAULTS[family]
    workers = defaults.num_worker_threads if num_worker_threads is None else num_worker_threads
    chunking = workers <= 1 if transfer_chunking is None else transfer_chunking
    return RdmaTuning(
        qp_per_transfer=defaults.qp_per_transfer if qp_per_transfer is None else qp_per_transfer,
        post_batch_size=post_batch_size,
        num_worker_threads=workers,
        poll_cq_event_mode=poll_cq_event_mode,
        enable_transfer_chunking=chunking,
        chunk_bytes=CHUNK_BYTES,
        max_send_wr=defaults.max_send_wr if max_send_wr is None else max_send_wr,
        send_wr_floor=defaults.send_wr_floor,
    )


@dataclass(frozen=True, slots=True)
class Override:
    variable: str
    field: str
    configured: object
    effective: object


@dataclass(frozen=True, slots=True)
class Ignored:
    """A ``MORI_IO_*`` value mori rejects (and warns about): the configured value stays."""

    variable: str
    raw: str


_OVERRIDES: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("MORI_IO_QP_PER_TRANSFER", "qp_per_transfer", envparse.positive_int),
    ("MORI_IO_POST_BATCH_SIZE", "post_batch_size", envparse.post_batch_size),
    ("MORI_IO_NUM_WORKER_THREADS", "num_worker_threads", envparse.positive_int),
    ("MORI_IO_NUM_NICS_PER_TRANSFER", "num_nics_per_transfer", envparse.positive_int),
    ("MORI_IO_QP_MAX_SEND_WR", "max_send_wr", envparse.positive_u32),
    ("MORI_IO_ENABLE_NOTIFICATION", "enable_notification", envparse.boolean),
    ("MORI_IO_ENABLE_CHUNKING", "enable_transfer_chunking", envparse.boolean),
    ("MORI_IO_CHUNK_BYTES", "chunk_bytes", envparse.positive_int),
    ("MORI_IO_MAX_CHUNKS", "max_chunks_per_transfer", envparse.positive_int),
    ("MORI_IO_POLL_CQ_MODE", "poll_cq_event_mode", envparse.event_poll_mode),
)
_QP_RANGES = (  # mori's QP attribute variables (also read under MORI_RDMA_*), and their range
    ("MORI_IO_QP_TIMEOUT", "MORI_RDMA_QP_TIMEOUT", "qp_timeout", 31),
    ("MORI_IO_QP_RETRY_CNT", "MORI_RDMA_QP_RETRY_CNT", "qp_retry_count", 7),
)


def effective_tuning(
    configured: RdmaTuning, environ: Mapping[str, str]
) -> tuple[RdmaTuning, tuple[Override, ...], tuple[Ignored, ...]]:
    """The tuning mori applies once ``environ`` is read, every override that changed it, and
    every value mori ignores."""
    changes: dict[str, object] = {}
    overrides: list[Override] = []
    ignored: list[Ignored] = []
    for variable, field, parse in _OVERRIDES:
        value, rejected = envparse.override(environ, variable, parse)
        if rejected is not None:
            ignored.append(Ignored(variable, rejected))
        before = getattr(configured, field)
        if value is not None and value != before:
            changes[field] = value
            overrides.append(Override(variable, field, before, value))
    for variable, alias, field, high in _QP_RANGES:
        for name in (variable, alias):
            value, rejected = envparse.override(environ, name, envparse.any_int)
            if value is not None and not 0 <= value <= high:
                value, rejected = None, environ[name]
            if rejected is not None:
                ignored.append(Ignored(name, rejected))
            if value is not None:
                changes[field] = value
                break
    return replace(configured, **changes), tuple(overrides), tuple(ignored)  # type: ignore[arg-type]


def sq_backoff_us(environ: Mapping[str, str]) -> int:
    """How long one post may block on a full send queue (MORI_IO_SQ_BACKOFF_TIMEOUT_US)."""
    value, _ = envparse.override(environ, "MORI_IO_SQ_BACKOFF_TIMEOUT_US", envparse.positive_int)
    return DEFAULT_SQ_BACKOFF_US if value is None else value


def check_advertised_host(host: str) -> str:
    """Peers dial ``inet_addr(host)``: refuse anything but a dialable IPv4 literal."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(
            f"mori needs the advertised host to be an IPv4 address literal (peers dial it with "
            f"inet_addr), got {host!r}; pass the IPv4 address of the RDMA-reachable interface"
        ) from None
    if address.is_unspecified or address.is_multicast:
        raise ValueError(f"mori cannot advertise {host!r}: peers could not dial it")
    return host


def resolve_tuning(key: str, configured: RdmaTuning) -> RdmaTuning:
    """Apply mori's ``MORI_IO_*`` overrides as mori will, warn about each, log the result."""
    tuning, overrides, ignored = effective_tuning(configured, os.environ)
    for o in overrides:
        _log.warning(
            "mori: an environment variable overrides the configured setting",
            variable=o.variable,
            effective=o.effective,
            setting=o.field,
            configured=o.configured,
            engine=key,
        )
    for i in ignored:
        _log.warning("mori: ignores an invalid value", variable=i.variable, value=i.raw)
    if tuning.enable_notification:
        _log.warning(
            "mori: notifications are on (MORI_IO_ENABLE_NOTIFICATION); moriio does not use them "
            "and under load they can fail transfers with ENOMEM"
        )
    if tuning.qp_timeout == 0:
        _log.warning(
            "mori: MORI_IO_QP_TIMEOUT=0 disables the queue pairs' ACK timeout: work to an "
            "unresponsive peer never fails, and memory it may still write is held until its "
            "connection's engine is destroyed"
        )
    _log.info(
        "mori: engine RDMA settings",
        engine=key,
        tuning=str(tuning),
        sq_full_post_block_us=sq_backoff_us(os.environ),
        cq_polling="busy (EVENT mode also spins: its loop calls epoll_wait with timeout 0)",
    )
    return tuning
