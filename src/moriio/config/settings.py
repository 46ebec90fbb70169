"""Connector settings: ``kv_connector_extra_config`` validated once, at start-up.

Every error names the offending key. Values arrive from JSON on the command line, so
numbers may come as strings ("6301") and booleans as "true"/"1".
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from moriio.domain.timing.policy import (
    DEFAULT_CLOCK_SKEW_ALLOWANCE,
    DEFAULT_LIVENESS_TIMEOUT,
    DEFAULT_QUARANTINE_TIMEOUT,
    MAX_CLOCK_SKEW_ALLOWANCE,
)
from moriio.domain.wire.hosts import InvalidHostError, canonical_host
from moriio.domain.wire.modes import LoadMode, TransferMode

DEFAULT_HANDSHAKE_PORT = 6301
DEFAULT_NOTIFY_PORT = 61005
DEFAULT_TRANSFER_TIMEOUT = 30.0
DEFAULT_DEFER_TIMEOUT = 60.0
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_HANDSHAKE_RETRY_AFTER = 1.0
DEFAULT_HANDSHAKE_MAX_RETRY_AFTER = 30.0
MAX_HANDSHAKE_BACKOFF = 3600.0  # the longest a failing peer may be shunned

E = TypeVar("E", bound=enum.Enum)

DEFAULT_PROGRESS_INTERVAL = 0.001
DEFAULT_IDLE_STEP_WAIT = 0.01
DEFAULT_PROXY_PING_INTERVAL = 3.0  # the in-tree MoRIIO connector's

# Keys other connectors accept that have no meaning here; accepted and unused.
COMPAT_IGNORED_KEYS: frozenset[str] = frozenset()

DEPRECATED_ENV_VARS = {
    "VLLM_MORIIO_CONNECTOR_READ_MODE": "read_mode",
    "VLLM_MORIIO_QP_PER_TRANSFER": "qp_per_transfer",
    "VLLM_MORIIO_POST_BATCH_SIZE": "post_batch_size",
    "VLLM_MORIIO_NUM_WORKERS": "num_workers",
}


class SettingsError(ValueError):
    """A ``kv_connector_extra_config`` value is invalid; the message names the key."""


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


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    mode: TransferMode = TransferMode.WRITE
    load_mode: LoadMode = LoadMode.ASYNC
    layer_barrier: LayerBarrier = LayerBarrier.AUTO
    same_host_copies: bool = True
    transport: Transport = Transport.MORI
    backend: Backend = Backend.RDMA
    host_ip: str | None = None
    listen_host: str | None = None  # None or "*": all interfaces
    handshake_port: int = DEFAULT_HANDSHAKE_PORT
    notify_port: int = DEFAULT_NOTIFY_PORT
    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_workers: int = 1
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


KNOWN_KEYS = frozenset(
    {
        "read_mode",
        "load_mode",
        "layer_barrier",
        "same_host_copies",
        "transport",
        "backend",
        "host_ip",
        "listen_host",
        "handshake_port",
        "notify_port",
        "qp_per_transfer",
        "post_batch_size",
        "num_workers",
        "transfer_timeout",
        "defer_timeout",
        "clock_skew_allowance",
        "quarantine_timeout",
        "liveness_timeout",
        "handshake_timeout",
        "handshake_retry_after",
        "handshake_max_retry_after",
        "trusted_remote_hosts",
        "shared_secret_env",
        "shared_secret_file",
        "chaos_seed",
        "progress_interval",
        "idle_step_wait",
        "proxy_ip",
        "proxy_ping_port",
        "proxy_ping_interval",
        "http_port",
    }
)


def parse_settings(extra: Mapping[str, Any] | None) -> tuple[ConnectorSettings, list[str]]:
    """Validate ``extra``; return the settings and the unknown keys (for a warning)."""
    extra = dict(extra or {})
    unknown = sorted(k for k in extra if k not in KNOWN_KEYS and k not in COMPAT_IGNORED_KEYS)
    hosts, trust_any = _hosts(extra.get("trusted_remote_hosts"))
    settings = ConnectorSettings(
        mode=TransferMode.READ if _bool(extra, "read_mode", False) else TransferMode.WRITE,
        load_mode=_enum(extra, "load_mode", LoadMode, LoadMode.ASYNC),
        layer_barrier=_enum(extra, "layer_barrier", LayerBarrier, LayerBarrier.AUTO),
        same_host_copies=_bool(extra, "same_host_copies", True),
        transport=_enum(extra, "transport", Transport, Transport.MORI),
        backend=_enum(extra, "backend", Backend, Backend.RDMA),
        host_ip=_optional_str(extra, "host_ip"),
        listen_host=_listen_host(extra),
        handshake_port=_int(extra, "handshake_port", DEFAULT_HANDSHAKE_PORT, 1, 65535),
        notify_port=_int(extra, "notify_port", DEFAULT_NOTIFY_PORT, 1, 65535),
        qp_per_transfer=_int(extra, "qp_per_transfer", 1, 1, 1024),
        post_batch_size=_post_batch(extra),
        num_workers=_int(extra, "num_workers", 1, 1, 1024),
        transfer_timeout=_seconds(extra, "transfer_timeout", DEFAULT_TRANSFER_TIMEOUT),
        defer_timeout=_seconds(extra, "defer_timeout", DEFAULT_DEFER_TIMEOUT),
        clock_skew_allowance=_skew(extra),
        quarantine_timeout=_seconds(extra, "quarantine_timeout", DEFAULT_QUARANTINE_TIMEOUT),
        liveness_timeout=_liveness(extra),
        handshake_timeout=_seconds(extra, "handshake_timeout", DEFAULT_HANDSHAKE_TIMEOUT),
        handshake_retry_after=_backoff(
            extra, "handshake_retry_after", DEFAULT_HANDSHAKE_RETRY_AFTER
        ),
        handshake_max_retry_after=_backoff(
            extra, "handshake_max_retry_after", DEFAULT_HANDSHAKE_MAX_RETRY_AFTER
        ),
        trusted_remote_hosts=hosts,
        trust_any_host=trust_any,
        shared_secret_env=_optional_str(extra, "shared_secret_env"),
        shared_secret_file=_optional_str(extra, "shared_secret_file"),
        chaos_seed=_optional_int(extra, "chaos_seed"),
        progress_interval=_seconds(extra, "progress_interval", DEFAULT_PROGRESS_INTERVAL),
        idle_step_wait=_idle_step_wait(extra),
        proxy_ip=_optional_host(extra, "proxy_ip"),
        proxy_ping_port=_optional_port(extra, "proxy_ping_port"),
        proxy_ping_interval=_seconds(extra, "proxy_ping_interval", DEFAULT_PROXY_PING_INTERVAL),
        http_port=_optional_port(extra, "http_port"),
    )
    if settings.progress_interval > 1.0:
        raise SettingsError(
            f"progress_interval must be at most 1 second, got {settings.progress_interval!r}"
        )
    if (settings.proxy_ip is None) != (settings.proxy_ping_port is None):
        raise SettingsError("set both proxy_ip and proxy_ping_port to register with a router")
    if settings.proxy_ip is not None and settings.http_port is None:
        raise SettingsError(
            "http_port (the engine's HTTP port, as given to vllm serve --port) is required "
            "with proxy_ip and proxy_ping_port"
        )
    if settings.shared_secret_env and settings.shared_secret_file:
        raise SettingsError("set only one of shared_secret_env and shared_secret_file")
    return _consistent(settings), unknown


def _bool(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise SettingsError(f"{key} must be a boolean (true/false), got {value!r}")


def _enum(extra: Mapping[str, Any], key: str, kind: type[E], default: E) -> E:
    value = extra.get(key)
    if value is None:
        return default
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise SettingsError(f"{key} must be one of {allowed}, got {value!r}") from None


def _int(extra: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = extra.get(key, default)
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SettingsError(f"{key} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not low <= number <= high:
        raise SettingsError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return number


def _optional_int(extra: Mapping[str, Any], key: str) -> int | None:
    if extra.get(key) is None:
        return None
    return _int(extra, key, 0, 0, 2**63 - 1)


def _optional_host(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    try:
        return canonical_host(value)
    except InvalidHostError as exc:
        raise SettingsError(f"{key} is not a valid host: {exc}") from None


def _listen_host(extra: Mapping[str, Any]) -> str | None:
    """``listen_host``: ``"*"`` (all interfaces, the default) or one IP address."""
    value = extra.get("listen_host")
    if value is None or value == "*":
        return value
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise SettingsError(
            f"listen_host must be '*' (all interfaces) or an IP address, got {value!r:.80}"
        ) from None


def _optional_port(extra: Mapping[str, Any], key: str) -> int | None:
    if extra.get(key) in (None, "", 0, "0"):
        return None
    return _int(extra, key, 0, 1, 65535)


def _post_batch(extra: Mapping[str, Any]) -> int:
    value = _int(extra, "post_batch_size", -1, -1, 1 << 20)
    if value == 0:
        raise SettingsError("post_batch_size must be -1 (backend default) or positive, got 0")
    return value


def _seconds(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{key} must be a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise SettingsError(f"{key} must be a positive, finite number of seconds, got {value!r}")
    return seconds


def _idle_step_wait(extra: Mapping[str, Any]) -> float:
    """``idle_step_wait``: seconds in [0, 1] (0: an idle step returns at once)."""
    if extra.get("idle_step_wait") in (0, 0.0) and extra["idle_step_wait"] is not False:
        return 0.0
    seconds = _seconds(extra, "idle_step_wait", DEFAULT_IDLE_STEP_WAIT)
    if seconds > 1.0:
        raise SettingsError(f"idle_step_wait must be at most 1 second, got {seconds!r}")
    return seconds


def _liveness(extra: Mapping[str, Any]) -> float:
    """``liveness_timeout``: positive seconds, or 0 (no liveness probes)."""
    if extra.get("liveness_timeout") in (0, 0.0) and extra["liveness_timeout"] is not False:
        return 0.0
    return _seconds(extra, "liveness_timeout", DEFAULT_LIVENESS_TIMEOUT)


def _backoff(extra: Mapping[str, Any], key: str, default: float) -> float:
    seconds = _seconds(extra, key, default)
    if seconds > MAX_HANDSHAKE_BACKOFF:
        raise SettingsError(
            f"{key} must be at most {MAX_HANDSHAKE_BACKOFF:g} seconds, got {extra.get(key)!r}"
        )
    return seconds


def _skew(extra: Mapping[str, Any]) -> float:
    key = "clock_skew_allowance"
    value = extra.get(key, DEFAULT_CLOCK_SKEW_ALLOWANCE)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{key} must be a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not 0 <= seconds <= MAX_CLOCK_SKEW_ALLOWANCE:
        raise SettingsError(
            f"{key} must be a number of seconds in [0, {MAX_CLOCK_SKEW_ALLOWANCE:g}], got {value!r}"
        )
    return seconds


def _optional_str(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SettingsError(f"{key} must be a string, got {value!r}")
    return value.strip()


def _hosts(value: object) -> tuple[tuple[str, ...], bool]:
    """Comma-separated string or list of hosts; ``"*"`` trusts any host (explicit opt-in)."""
    if value is None:
        return (), False
    if isinstance(value, str):
        items = [h.strip() for h in value.split(",")]
    elif isinstance(value, list | tuple):
        if not all(isinstance(h, str) for h in value):
            raise SettingsError("trusted_remote_hosts must be a list of host strings")
        items = [h.strip() for h in value]
    else:
        raise SettingsError(
            f"trusted_remote_hosts must be a comma-separated string or a list, got {value!r}"
        )
    hosts = tuple(dict.fromkeys(h for h in items if h and h != "*"))
    return hosts, "*" in items


def _consistent(settings: ConnectorSettings) -> ConnectorSettings:
    """Cross-key checks: values that are each valid but cannot work together."""
    if settings.defer_timeout <= settings.transfer_timeout + settings.clock_skew_allowance:
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
