"""Connector settings: ``kv_connector_extra_config`` validated once, before anything heavy.

Every error names the offending key: an unknown key (with the nearest known one), a bad value,
or values that cannot work together. Values arrive from JSON on the command line, so numbers
may come as strings ("6301") and booleans as "true"/"1". Single values are parsed by
:mod:`moriio.config.values`, keys are listed in :mod:`moriio.config.keys`.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moriio.config import values as v
from moriio.config.keys import (
    COMPAT_IGNORED_KEYS,
    DEPRECATED_ENV_VARS,
    IN_TREE_REFUSED,
    KNOWN_KEYS,
    check_keys,
)
from moriio.config.transport import HostFacts, auto_transport, host_facts, mori_missing_error
from moriio.config.values import InvalidValueError, SettingsError
from moriio.domain.timing.policy import (
    DEFAULT_CLOCK_SKEW_ALLOWANCE,
    DEFAULT_LIVENESS_TIMEOUT,
    DEFAULT_QUARANTINE_TIMEOUT,
    MAX_CLOCK_SKEW_ALLOWANCE,
    TransferPolicy,
)
from moriio.domain.values.modes import LoadMode, TransferMode

DEFAULT_HANDSHAKE_PORT = 6301
DEFAULT_NOTIFY_PORT = 61005
DEFAULT_TRANSFER_TIMEOUT = 30.0
DEFAULT_DEFER_TIMEOUT = 60.0
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_HANDSHAKE_RETRY_AFTER = 1.0
DEFAULT_HANDSHAKE_MAX_RETRY_AFTER = 30.0
MAX_HANDSHAKE_BACKOFF = 3600.0  # the longest a failing peer may be shunned

DEFAULT_PROGRESS_INTERVAL = 0.001
DEFAULT_IDLE_STEP_WAIT = 0.01
DEFAULT_PROXY_PING_INTERVAL = 3.0  # the in-tree MoRIIO connector's


class Transport(enum.Enum):
    MORI = "mori"
    NIXL = "nixl"


class Backend(enum.Enum):
    RDMA = "rdma"
    XGMI = "xgmi"


class LayerBarrier(enum.Enum):
    """How a layerwise READ's forward waits for each layer's KV (device KV caches)."""

    AUTO = "auto"  # on the device's stream where it supports stream memory waits, else host
    DEVICE = "device"  # on the device's stream; start-up fails where the device cannot
    HOST = "host"  # the forward thread polls (FULL CUDA graph batches wait before the step)


class KVCacheLayout(enum.Enum):
    """The page order asked of vLLM (``get_required_kvcache_layout``): one of vLLM 0.32's
    ``KVCacheLayout`` names, or the attention backends' own choice."""

    ENGINE = "engine"
    LBNHC = "lbnhc"
    LBHNC = "lbhnc"
    LHBNC = "lhbnc"
    BLNHC = "blnhc"
    BLHNC = "blhnc"
    BHLNC = "bhlnc"

    @property
    def vllm_name(self) -> str | None:
        """The name vLLM takes (None: let the backends choose)."""
        return None if self is KVCacheLayout.ENGINE else self.value.upper()


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    mode: TransferMode = TransferMode.WRITE
    load_mode: LoadMode = LoadMode.ASYNC
    layer_barrier: LayerBarrier = LayerBarrier.AUTO
    same_host_copies: bool = True
    kv_cache_layout: KVCacheLayout = KVCacheLayout.ENGINE
    transport: Transport = Transport.MORI  # parse_settings chooses by host when absent
    backend: Backend = Backend.RDMA
    host_ip: str | None = None
    listen_host: str | None = None  # None or "*": all interfaces
    handshake_port: int = DEFAULT_HANDSHAKE_PORT
    notify_port: int = DEFAULT_NOTIFY_PORT
    qp_per_transfer: int | None = None  # None: chosen for the host's NICs (mori adapter)
    post_batch_size: int = -1
    num_workers: int | None = None  # None: chosen for the host's NICs (mori adapter)
    transfer_timeout: float = DEFAULT_TRANSFER_TIMEOUT
    defer_timeout: float = DEFAULT_DEFER_TIMEOUT
    clock_skew_allowance: float = DEFAULT_CLOCK_SKEW_ALLOWANCE
    quarantine_timeout: float = DEFAULT_QUARANTINE_TIMEOUT
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    handshake_retry_after: float = DEFAULT_HANDSHAKE_RETRY_AFTER
    handshake_max_retry_after: float = DEFAULT_HANDSHAKE_MAX_RETRY_AFTER
    trusted_remote_hosts: tuple[str, ...] = ()
    trust_any_host: bool = False
    shared_secret_env: str | None = None
    shared_secret_file: str | None = None
    chaos_seed: int | None = None
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    idle_step_wait: float = DEFAULT_IDLE_STEP_WAIT
    proxy_ip: str | None = None
    proxy_ping_port: int | None = None
    proxy_ping_interval: float = DEFAULT_PROXY_PING_INTERVAL
    http_port: int | None = None

    def transfer_policy(self) -> TransferPolicy:
        """The timeouts as the :class:`TransferPolicy` both sides of the connector keep."""
        return TransferPolicy(
            transfer_timeout=self.transfer_timeout,
            defer_timeout=self.defer_timeout,
            clock_skew_allowance=self.clock_skew_allowance,
            quarantine_timeout=self.quarantine_timeout,
            liveness_timeout=self.liveness_timeout,
        )


def parse_settings(
    extra: Mapping[str, Any] | None, *, facts: HostFacts | None = None
) -> ConnectorSettings:
    """Validate ``extra`` (SettingsError names the key); ``facts``: this host's, by default
    (read only when ``transport`` is absent or ``mori``)."""
    extra = dict(extra or {})
    check_keys(extra)
    if v.optional_str(extra, "shared_secret_env") and extra.get("shared_secret_file"):
        raise SettingsError("set only one of shared_secret_env and shared_secret_file")
    hosts, trust_any = v.trusted_hosts(extra, "trusted_remote_hosts")
    settings = ConnectorSettings(
        mode=TransferMode.READ if v.boolean(extra, "read_mode", False) else TransferMode.WRITE,
        load_mode=v.choice(extra, "load_mode", LoadMode, LoadMode.ASYNC),
        layer_barrier=v.choice(extra, "layer_barrier", LayerBarrier, LayerBarrier.AUTO),
        same_host_copies=v.boolean(extra, "same_host_copies", True),
        kv_cache_layout=v.choice(extra, "kv_cache_layout", KVCacheLayout, KVCacheLayout.ENGINE),
        transport=_transport(extra, facts),
        backend=v.choice(extra, "backend", Backend, Backend.RDMA),
        host_ip=v.advertised_host(extra, "host_ip"),
        listen_host=v.listen_host(extra, "listen_host"),
        handshake_port=v.integer(extra, "handshake_port", DEFAULT_HANDSHAKE_PORT, 1, 65535),
        notify_port=v.integer(extra, "notify_port", DEFAULT_NOTIFY_PORT, 1, 65535),
        qp_per_transfer=_optional_count(extra, "qp_per_transfer"),
        post_batch_size=_post_batch(extra),
        num_workers=_optional_count(extra, "num_workers"),
        transfer_timeout=v.seconds(extra, "transfer_timeout", DEFAULT_TRANSFER_TIMEOUT),
        defer_timeout=v.seconds(extra, "defer_timeout", DEFAULT_DEFER_TIMEOUT),
        clock_skew_allowance=v.seconds(
            extra,
            "clock_skew_allowance",
            DEFAULT_CLOCK_SKEW_ALLOWANCE,
            zero=True,
            high=MAX_CLOCK_SKEW_ALLOWANCE,
        ),
        quarantine_timeout=v.seconds(extra, "quarantine_timeout", DEFAULT_QUARANTINE_TIMEOUT),
        liveness_timeout=v.seconds(extra, "liveness_timeout", DEFAULT_LIVENESS_TIMEOUT, zero=True),
        handshake_timeout=v.seconds(extra, "handshake_timeout", DEFAULT_HANDSHAKE_TIMEOUT),
        handshake_retry_after=v.seconds(
            extra,
            "handshake_retry_after",
            DEFAULT_HANDSHAKE_RETRY_AFTER,
            high=MAX_HANDSHAKE_BACKOFF,
        ),
        handshake_max_retry_after=v.seconds(
            extra,
            "handshake_max_retry_after",
            DEFAULT_HANDSHAKE_MAX_RETRY_AFTER,
            high=MAX_HANDSHAKE_BACKOFF,
        ),
        trusted_remote_hosts=hosts,
        trust_any_host=trust_any,
        shared_secret_env=v.optional_str(extra, "shared_secret_env"),
        shared_secret_file=v.readable_file(extra, "shared_secret_file"),
        chaos_seed=v.optional_int(extra, "chaos_seed"),
        progress_interval=v.seconds(
            extra, "progress_interval", DEFAULT_PROGRESS_INTERVAL, high=1.0
        ),
        idle_step_wait=v.seconds(
            extra, "idle_step_wait", DEFAULT_IDLE_STEP_WAIT, zero=True, high=1.0
        ),
        proxy_ip=v.optional_host(extra, "proxy_ip"),
        proxy_ping_port=v.optional_port(extra, "proxy_ping_port"),
        proxy_ping_interval=v.seconds(extra, "proxy_ping_interval", DEFAULT_PROXY_PING_INTERVAL),
        http_port=v.optional_port(extra, "http_port"),
    )
    if (settings.proxy_ip is None) != (settings.proxy_ping_port is None):
        raise SettingsError("set both proxy_ip and proxy_ping_port to register with a router")
    if settings.proxy_ip is not None and settings.http_port is None:
        raise SettingsError(
            "http_port (the engine's HTTP port, as given to vllm serve --port) is required "
            "with proxy_ip and proxy_ping_port"
        )
    return _consistent(settings, explicit_transport=extra.get("transport") is not None)


def transport_choice(extra: Mapping[str, Any] | None, facts: HostFacts | None = None) -> str:
    """How ``transport`` was decided, for the start-up log."""
    if extra and extra.get("transport") is not None:
        return "as configured"
    return "chosen for this host: " + auto_transport(facts or host_facts())[1]


def settings_by_key(settings: ConnectorSettings) -> dict[str, object]:
    """The values the in-tree connector's environment variables would set, by key (a value
    left to the transport to choose is not one)."""
    chosen: dict[str, object | None] = {
        "read_mode": settings.mode is TransferMode.READ,
        "qp_per_transfer": settings.qp_per_transfer,
        "post_batch_size": settings.post_batch_size,
        "num_workers": settings.num_workers,
        "transfer_timeout": settings.transfer_timeout,
    }
    return {key: value for key, value in chosen.items() if value is not None}


def _transport(extra: Mapping[str, Any], facts: HostFacts | None) -> Transport:
    if extra.get("transport") is None:
        return Transport(auto_transport(facts or host_facts())[0])
    transport = v.choice(extra, "transport", Transport, Transport.MORI)
    if transport is Transport.MORI and not (facts or host_facts()).mori_installed:
        raise InvalidValueError(mori_missing_error())
    return transport


def _optional_count(extra: Mapping[str, Any], key: str) -> int | None:
    """A count in [1, 1024], or None when absent (the transport chooses)."""
    return None if extra.get(key) is None else v.integer(extra, key, 1, 1, 1024)


def _post_batch(extra: Mapping[str, Any]) -> int:
    value = v.integer(extra, "post_batch_size", -1, -1, 1 << 20)
    if value == 0:
        raise InvalidValueError("post_batch_size must be -1 (backend default) or positive, got 0")
    return value


def _consistent(settings: ConnectorSettings, *, explicit_transport: bool) -> ConnectorSettings:
    """Cross-key checks: values that are each valid but cannot work together."""
    if settings.backend is Backend.XGMI and settings.transport is not Transport.MORI:
        chosen = "" if explicit_transport else " (chosen for this host: no transport key)"
        raise SettingsError(
            f'backend xgmi needs transport mori, but transport is "{settings.transport.value}"'
            f"{chosen}: XGMI is mori's intra-node backend for AMD GPUs"
        )
    if settings.transport is Transport.MORI and settings.host_ip is not None:
        _check_mori_host(settings.host_ip)
    if not settings.transfer_policy().read_fits_lease():
        # The consumer refuses a read that could outlive the producer's lease (defer_timeout
        # from the prefill's end) less the skew allowance, so every READ would be refused.
        raise SettingsError(
            f"defer_timeout ({settings.defer_timeout:g} s) must exceed transfer_timeout "
            f"({settings.transfer_timeout:g} s) plus clock_skew_allowance "
            f"({settings.clock_skew_allowance:g} s): the producer's lease must outlast a "
            "transfer on any host's clock"
        )
    if settings.load_mode is LoadMode.LAYERWISE and settings.mode is not TransferMode.READ:
        raise SettingsError(
            "load_mode layerwise needs read_mode true: WRITE loads are always asynchronous "
            "(the producer pushes after its own forward)"
        )
    if settings.handshake_retry_after > settings.handshake_max_retry_after:
        raise SettingsError(
            f"handshake_retry_after ({settings.handshake_retry_after:g} s) must not exceed "
            f"handshake_max_retry_after ({settings.handshake_max_retry_after:g} s)"
        )
    if settings.handshake_port == settings.notify_port:
        raise SettingsError(
            f"handshake_port and notify_port must differ, both are {settings.handshake_port}"
        )
    return settings


def _check_mori_host(host: str) -> None:
    """mori peers dial the advertised host with ``inet_addr``: an IPv4 literal only."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise SettingsError(
            f"host_ip must be an IPv4 address with transport mori (peers dial it with "
            f"inet_addr), got {host!r}"
        ) from None
    if address.is_multicast:
        raise SettingsError(f"host_ip {host!r} is a multicast address: peers cannot dial it")


__all__ = [
    "COMPAT_IGNORED_KEYS",
    "DEPRECATED_ENV_VARS",
    "IN_TREE_REFUSED",
    "KNOWN_KEYS",
    "Backend",
    "ConnectorSettings",
    "HostFacts",
    "InvalidValueError",
    "LayerBarrier",
    "SettingsError",
    "Transport",
    "parse_settings",
    "settings_by_key",
    "transport_choice",
]
