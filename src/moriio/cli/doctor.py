"""``moriio doctor``: preflight a deployment: transports, UCX/mori environment, ports, a peer.

Each line is PASS, WARN or FAIL with its reason; the exit status is 1 when any line FAILs.
With ``--peer HOST:PORT`` it handshakes with a running peer's handshake port (showing the
fingerprint diff on a mismatch) and READs one block of the peer's first layer, printing its
checksum. The ``--model``/``--dtype``/... flags set the fingerprint offered in the handshake.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from typing import Any

from moriio.config.settings import DEFAULT_HANDSHAKE_PORT, DEFAULT_NOTIFY_PORT
from moriio.doctor.checks import (
    Check,
    Status,
    env_checks,
    host_devices,
    is_loopback,
    load_secret,
    local_host_for,
    parse_peer,
    parse_ports,
    port_checks,
    summarize,
    transport_checks,
    vllm_check,
)
from moriio.doctor.device import get_zcopy_check, layer_barrier_check, ucx_protocol_checks
from moriio.doctor.mori_version import installed_mori, mori_version_check
from moriio.domain.kv.layout import LayoutKind
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.values.modes import TransferMode
from moriio.output import stdout_to_stderr, to_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ports",
        default=f"{DEFAULT_HANDSHAKE_PORT},{DEFAULT_NOTIFY_PORT}",
        help="base ports to test for binding ('' skips; default: the connector's)",
    )
    parser.add_argument("--ranks", type=int, default=1, help="ranks per base port to test")
    parser.add_argument("--host", default="0.0.0.0", help="address the ports are bound on")
    parser.add_argument(
        "--transport", choices=("any", "nixl", "mori"), default="any", help="engine to require"
    )
    parser.add_argument("--peer", help="HOST:PORT of a running peer's handshake port")
    parser.add_argument("--bind-host", help="local address for the handshake (default: route)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per peer step")
    parser.add_argument("--secret-env", help="variable holding the shared HMAC secret")
    parser.add_argument("--secret-file", help="file holding the shared HMAC secret")
    parser.add_argument(
        "--max-read-bytes", type=int, default=64 << 20, help="largest block to READ"
    )
    fp = parser.add_argument_group("fingerprint offered in the handshake")
    fp.add_argument("--model", default="unset", help="model name, as the engines serve it")
    fp.add_argument("--dtype", default="bfloat16", help="KV cache dtype (torch name)")
    fp.add_argument("--block-size", type=int, default=16)
    fp.add_argument("--num-layers", type=int, default=1, help="KV cache layers")
    fp.add_argument(
        "--layout-kind",
        choices=[k.value for k in LayoutKind],
        default=LayoutKind.SEPARATED.value,
        help="layout kind of every layer",
    )
    fp.add_argument("--tp-size", type=int, default=1)
    fp.add_argument("--mode", choices=("read", "write"), default="read")
    fp.add_argument("--num-kv-heads", type=int, default=1, help="total KV heads of the model")
    fp.add_argument("--mla", action="store_true", help="the model uses MLA")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--config",
        metavar="JSON",
        help="only check a kv_connector_extra_config (inline JSON or @file), no engine needed",
    )


def fingerprint_from_args(args: argparse.Namespace) -> Fingerprint:
    """The local fingerprint the flags describe; ValueError names a bad value."""
    if args.num_layers < 1:
        raise ValueError(f"--num-layers must be >= 1, got {args.num_layers}")
    return Fingerprint(
        model_name=args.model,
        dtype=args.dtype,
        block_size=args.block_size,
        layout_kinds=(args.layout_kind,) * args.num_layers,
        tp_size=args.tp_size,
        transfer_mode=TransferMode(args.mode),
        total_num_kv_heads=args.num_kv_heads,
        is_mla=args.mla,
    )


def render(checks: Sequence[Check]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.status.value}  {c.name.ljust(width)}  {c.detail}")
        lines.extend(f"      {' ' * width}  {note}" for note in c.notes)
    counts = summarize(checks)
    lines.append(
        f"result: {counts[Status.FAIL]} FAIL, {counts[Status.WARN]} WARN, "
        f"{counts[Status.PASS]} PASS"
    )
    return "\n".join(lines)


def _gate_probe() -> Callable[[], str | None] | None:
    """Whether this host's device can wait on layer gates (None: no CUDA/ROCm device)."""
    if find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None

    def probe() -> str | None:
        from moriio.adapters.device.stream_gates import probe_stream_gates

        gates = probe_stream_gates(torch.device("cuda", torch.cuda.current_device()), 1)
        return gates if isinstance(gates, str) else None

    return probe


def _protocol_probe(usable: Sequence[str]) -> Callable[[], Any] | None:
    """The UCX protocol probe on this host's first GPU (None: no GPU, or no NIXL)."""
    if "nixl" not in usable or find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None

    def probe() -> Any:
        from moriio.vllm_plugin.ucx_report import probe_device

        return probe_device(torch.device("cuda", torch.cuda.current_device()))

    return probe


def collect(args: argparse.Namespace) -> tuple[list[Check], dict[str, Any] | None]:
    """Run every check the arguments ask for; the checks and the peer details."""
    if args.config is not None:
        return config_checks(args.config), None
    ports = parse_ports(args.ports)
    peer = parse_peer(args.peer) if args.peer else None
    fingerprint = fingerprint_from_args(args) if peer else None
    secret = load_secret(args.secret_env, args.secret_file)
    if args.ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {args.ranks}")
    net, ib = host_devices()
    checks = env_checks(os.environ, net_devices=net, ib_devices=ib)
    checks.append(get_zcopy_check(os.environ))  # before NIXL's loader sets moriio's default
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    transports, usable = transport_checks(
        args.transport, loopback=peer is None or is_loopback(peer.host)
    )
    checks += transports
    if (mori := mori_version_check(installed_mori())) is not None:
        checks.append(mori)
    checks.append(vllm_check())
    checks.append(layer_barrier_check(_gate_probe()))
    checks += ucx_protocol_checks(_protocol_probe(usable))
    checks += port_checks(args.host, ports, ranks=args.ranks)
    if peer is None or fingerprint is None:
        return checks, None
    transport = args.transport if args.transport != "any" else (usable or ["nixl"])[0]
    from moriio.doctor.peer import check_peer

    report = check_peer(
        peer,
        fingerprint,
        transport=transport,
        bind_host=args.bind_host or local_host_for(peer.host),
        timeout=args.timeout,
        secret=secret,
        max_read_bytes=args.max_read_bytes,
    )
    checks += report.checks
    return checks, {"address": report.address, "transport": transport, **report.info}


def config_checks(text: str) -> list[Check]:
    """``--config``: one FAIL per problem of the configuration, else PASS (and its warnings)."""
    from moriio.config.check import check_config, read_config_arg

    report = check_config(read_config_arg(text), os.environ)
    checks = [Check("config", Status.FAIL, error) for error in report.errors]
    checks += [Check("config", Status.WARN, warning) for warning in report.warnings]
    if report.settings is not None:
        checks.append(Check("config", Status.PASS, report.summary))
    return checks


def _check_dict(c: Check) -> dict[str, Any]:
    return {"name": c.name, "status": c.status.value, "detail": c.detail, "notes": list(c.notes)}


def run(args: argparse.Namespace) -> int:
    try:
        if args.json:
            with stdout_to_stderr():
                checks, peer = collect(args)
        else:
            checks, peer = collect(args)
    except (ValueError, OSError) as exc:
        print(f"moriio doctor: error: {exc}", file=sys.stderr)
        return 2
    failed = any(c.status is Status.FAIL for c in checks)
    if args.json:
        counts = summarize(checks)
        print(
            to_json(
                {
                    "ok": not failed,
                    "counts": {s.value: n for s, n in counts.items()},
                    "checks": [_check_dict(c) for c in checks],
                    "peer": peer,
                }
            )
        )
    else:
        print(render(checks))
    return 1 if failed else 0
