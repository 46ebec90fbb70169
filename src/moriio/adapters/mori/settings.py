"""RDMA backend settings as mori will really apply them, and start-up checks.

mori's ``RdmaBackend`` lets ``MORI_IO_*`` environment variables override the
``RdmaBackendConfig`` it is given (``src/io/rdma/backend_impl.cpp``). The adapter resolves the
same overrides so that it logs, warns about and reasons on the values mori will use.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from moriio.log import get_logger

_log = get_logger("moriio.adapters.mori.engine")

DEFAULT_SEND_WR = 8192
"""Send-queue depth per QP when ``max_send_wr`` is 0 (mori's default)."""

DEFAULT_SQ_BACKOFF_US = 5_000_000
"""How long mori's post blocks on a full send queue unless MORI_IO_SQ_BACKOFF_TIMEOUT_US."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class RdmaTuning:
    """The RDMA backend values that change how a batch is posted."""

    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_worker_threads: int = -1
    poll_cq_event_mode: bool = False
    enable_notification: bool = False
    enable_transfer_chunking: bool = False
    num_nics_per_transfer: int = 1
    max_send_wr: int = DEFAULT_SEND_WR

    def single_chain(self, descriptors: int) -> bool:
        """True when mori posts ``descriptors`` as one ``ibv_post_send`` chain on one QP.

        Then a "SQ full" refusal means nothing was posted, so re-posting cannot duplicate work.
        Several QPs, an explicit ``post_batch_size``, chunking, several NICs or more
        descriptors than the send queue holds all split a batch into several chains.
        """
        return (
            self.qp_per_transfer == 1
            and self.post_batch_size == -1
            and not self.enable_transfer_chunking
            and self.num_nics_per_transfer == 1
            and descriptors <= self.max_send_wr
        )


_INT_VARS = {
    "MORI_IO_QP_PER_TRANSFER": "qp_per_transfer",
    "MORI_IO_POST_BATCH_SIZE": "post_batch_size",
    "MORI_IO_NUM_WORKER_THREADS": "num_worker_threads",
    "MORI_IO_NUM_NICS_PER_TRANSFER": "num_nics_per_transfer",
    "MORI_IO_QP_MAX_SEND_WR": "max_send_wr",
}
_BOOL_VARS = {
    "MORI_IO_ENABLE_NOTIFICATION": "enable_notification",
    "MORI_IO_ENABLE_CHUNKING": "enable_transfer_chunking",
}
_UNKNOWN = -2  # an override mori may accept but we cannot parse: assume the worst


@dataclass(frozen=True, slots=True)
class Override:
    variable: str
    field: str
    configured: object
    effective: object


def _parse_int(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        return _UNKNOWN


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    return value in _TRUE or value not in _FALSE  # unknown spelling: assume "on"


def _parse_poll_mode(raw: str) -> bool:
    return raw.strip().lower() in ("1", "event")


def effective_tuning(
    configured: RdmaTuning, environ: Mapping[str, str]
) -> tuple[RdmaTuning, tuple[Override, ...]]:
    """The tuning mori applies once ``environ`` is read, and every override that changed it."""
    changes: dict[str, object] = {}
    overrides: list[Override] = []

    def apply(variable: str, field: str, value: object) -> None:
        before = getattr(configured, field)
        if value != before:
            changes[field] = value
            overrides.append(Override(variable, field, before, value))

    for variable, field in _INT_VARS.items():
        if variable in environ:
            value = _parse_int(environ[variable])
            if field == "max_send_wr" and value == 0:
                value = DEFAULT_SEND_WR
            apply(variable, field, value)
    for variable, field in _BOOL_VARS.items():
        if variable in environ:
            apply(variable, field, _parse_bool(environ[variable]))
    if "MORI_IO_POLL_CQ_MODE" in environ:
        mode = _parse_poll_mode(environ["MORI_IO_POLL_CQ_MODE"])
        apply("MORI_IO_POLL_CQ_MODE", "poll_cq_event_mode", mode)
    return replace(configured, **changes), tuple(overrides)  # type: ignore[arg-type]


def sq_backoff_us(environ: Mapping[str, str]) -> int:
    """How long one post may block on a full send queue (MORI_IO_SQ_BACKOFF_TIMEOUT_US)."""
    raw = environ.get("MORI_IO_SQ_BACKOFF_TIMEOUT_US")
    value = _parse_int(raw) if raw is not None else DEFAULT_SQ_BACKOFF_US
    return value if value > 0 else DEFAULT_SQ_BACKOFF_US


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
    tuning, overrides = effective_tuning(configured, os.environ)
    for o in overrides:
        _log.warning(
            "mori: an environment variable overrides the configured setting",
            variable=o.variable,
            effective=o.effective,
            setting=o.field,
            configured=o.configured,
            engine=key,
        )
    if tuning.enable_notification:
        _log.warning(
            "mori: notifications are on (MORI_IO_ENABLE_NOTIFICATION); moriio does not use them "
            "and under load they can fail transfers with ENOMEM"
        )
    _log.info(
        "mori: engine RDMA settings",
        engine=key,
        tuning=str(tuning),
        sq_full_post_block_us=sq_backoff_us(os.environ),
        sq_full_reposts="safe (one post chain)"
        if tuning.single_chain(1)
        else "refused (several post chains: SQ full fails the batch)",
    )
    return tuning
