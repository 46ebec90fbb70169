"""``moriio doctor``: the pure checks, argument parsing, fingerprint diffs, exit status."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from moriio.cli.doctor import fingerprint_from_args, render
from moriio.cli.main import build_parser, main
from moriio.doctor import checks as doctor_checks
from moriio.doctor.checks import (
    Check,
    Status,
    env_checks,
    load_secret,
    parse_peer,
    parse_ports,
    port_checks,
    transport_checks,
)
from moriio.doctor.fingerprints import diff_notes, ours_vs_peer, parse_rejection
from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.domain.values.modes import TransferMode
from moriio.ports import PeerAddress, TransferEngineError


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_parse_ports_and_peer() -> None:
    assert parse_ports("6301, 61005") == (6301, 61005)
    assert parse_ports("") == ()
    assert parse_peer("10.0.0.2:6301") == PeerAddress("10.0.0.2", 6301)
    assert parse_peer("[::1]:7000") == PeerAddress("::1", 7000)
    for bad, message in (("70000", "outside"), ("x", "port numbers")):
        with pytest.raises(ValueError, match=message):
            parse_ports(bad)
    for bad in ("host", "host:port", ":80", "h:0"):
        with pytest.raises(ValueError, match="--peer"):
            parse_peer(bad)


def test_unset_environment_passes_with_the_defaults_explained() -> None:
    checks = _by_name(env_checks({}, net_devices=frozenset({"lo", "eth0"})))

    assert all(c.status is Status.PASS for c in checks.values())
    assert "^ib" in checks["env UCX_MODULES"].detail
    assert checks["env MORI_IO_*"].detail == "none set: mori defaults"
    assert "env VLLM_MORIIO_*" not in checks


def test_environment_problems_are_warned_about() -> None:
    environ = {
        "UCX_MODULES": "ucm,uct",
        "UCX_NET_DEVICES": "lo,mlx5_0:1",
        "UCX_TLS": "",
        "UCX_LOG_LEVEL": "info",
        "MORI_IO_QP_PER_TRANSFER": "4",
        "VLLM_MORIIO_CONNECTOR_READ_MODE": "1",
    }
    checks = _by_name(env_checks(environ, net_devices=frozenset({"lo"})))

    assert checks["env UCX_MODULES"].status is Status.WARN
    assert checks["env UCX_NET_DEVICES"].status is Status.WARN
    assert "mlx5_0:1" in checks["env UCX_NET_DEVICES"].detail
    assert checks["env UCX_TLS"].status is Status.WARN
    assert checks["env UCX_*"].notes == ("UCX_LOG_LEVEL=info",)
    assert checks["env MORI_IO_*"].notes == ("MORI_IO_QP_PER_TRANSFER=4",)
    assert checks["env VLLM_MORIIO_*"].status is Status.WARN


def test_rdma_devices_make_ib_modules_and_device_names_fine() -> None:
    checks = _by_name(
        env_checks(
            {"UCX_MODULES": "ucm,uct", "UCX_NET_DEVICES": "mlx5_0:1", "UCX_TLS": "rc,cma"},
            net_devices=frozenset({"lo"}),
            ib_devices=frozenset({"mlx5_0"}),
        )
    )

    assert [c.status for c in checks.values()] == [Status.PASS] * len(checks)


def test_excluding_ib_modules_on_an_rdma_host_is_warned_about() -> None:
    rdma = frozenset({"mlx5_0"})
    excluded = _by_name(
        env_checks({"UCX_MODULES": "^ib"}, net_devices=frozenset({"lo"}), ib_devices=rdma)
    )
    unset = _by_name(env_checks({}, net_devices=frozenset({"lo"}), ib_devices=rdma))

    assert excluded["env UCX_MODULES"].status is Status.WARN
    assert "GPUDirect" in excluded["env UCX_MODULES"].detail
    assert unset["env UCX_MODULES"].status is Status.PASS
    assert "stay on" in unset["env UCX_MODULES"].detail


def test_port_checks_bind_for_real(busy_port: int) -> None:
    free = _free_port()
    checks = port_checks("127.0.0.1", [busy_port, free], range_file=Path("/nonexistent"))

    assert [c.status for c in checks] == [Status.FAIL, Status.PASS]
    assert "in use" in checks[0].detail
    assert checks[1].detail == "free on 127.0.0.1"


def test_port_checks_cover_every_rank(busy_port: int) -> None:
    checks = port_checks("127.0.0.1", [busy_port - 1], ranks=2)

    assert checks[1].name == f"port {busy_port} (base {busy_port - 1} + rank 1)"
    assert checks[1].status is Status.FAIL


def _missing() -> str:
    raise ImportError("No module named 'mori'")


def _broken(loopback: bool) -> str:
    raise TransferEngineError("cannot create NIXL agent")


def test_a_missing_transport_fails_only_when_required() -> None:
    checks, usable = transport_checks("any", loopback=True, nixl=lambda lb: "ok", mori=_missing)
    assert [c.status for c in checks] == [Status.PASS, Status.WARN]
    assert usable == ["nixl"]

    checks, usable = transport_checks("mori", loopback=True, nixl=lambda lb: "ok", mori=_missing)
    assert [c.status for c in checks] == [Status.PASS, Status.FAIL]


def test_no_usable_transport_fails() -> None:
    checks, usable = transport_checks("any", loopback=True, nixl=_broken, mori=_missing)

    assert usable == []
    assert [c.status for c in checks] == [Status.FAIL, Status.WARN, Status.FAIL]
    assert "cannot start" in checks[0].detail


def test_secret_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCTOR_SECRET", "s3cret-s3cret-s3cret")
    assert load_secret("DOCTOR_SECRET", None) == b"s3cret-s3cret-s3cret"
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"from-a-file-0123456\n")
    assert load_secret(None, str(secret_file)) == b"from-a-file-0123456"
    assert load_secret(None, None) is None
    with pytest.raises(ValueError, match="only one"):
        load_secret("DOCTOR_SECRET", str(secret_file))
    with pytest.raises(ValueError, match="unset or empty"):
        load_secret("DOCTOR_SECRET_UNSET", None)


def _fingerprint(**changes: object) -> Fingerprint:
    values: dict[str, object] = {
        "model_name": "llama",
        "dtype": "bfloat16",
        "block_size": 16,
        "layout_kinds": ("separated",) * 2,
        "tp_size": 1,
        "transfer_mode": TransferMode.READ,
        "total_num_kv_heads": 8,
        "is_mla": False,
    }
    values.update(changes)
    return Fingerprint(**values)  # type: ignore[arg-type]


def test_a_rejection_reason_becomes_our_side_of_the_diff() -> None:
    peer = _fingerprint(tp_size=2)  # TP 3 and 2 do not pair (1 and 3 would, by slicing)
    ours = _fingerprint(model_name="other", block_size=32, tp_size=3)
    try:
        peer.check_compatible(ours)  # what the peer does with our request
    except IncompatiblePeerError as exc:
        reason = str(exc)

    diffs = parse_rejection(reason)

    assert diffs is not None
    notes = diff_notes(diffs)
    assert notes[0] == "model_name: ours='other' peer='llama'  [--model]"
    assert notes[1] == "block_size: ours=32 peer=16  [--block-size]"
    assert notes[2].startswith("tp_size: ours=3 peer=2 (")
    assert parse_rejection("expected a handshake request, got Release") is None


def test_local_diff_is_printed_from_our_side() -> None:
    ours, peer = _fingerprint(), _fingerprint(layout_kinds=("separated", "mla"), is_mla=True)

    notes = diff_notes(ours_vs_peer(ours.diff(peer)))

    assert notes == (
        "layout_kinds: ours='separated' peer='mla' (layer 1)  [--layout-kind]",
        "is_mla: ours=False peer=True  [--mla]",
    )


def test_fingerprint_flags() -> None:
    args = build_parser().parse_args(
        [
            "doctor",
            "--model",
            "m",
            "--dtype",
            "float16",
            "--block-size",
            "32",
            "--num-layers",
            "3",
            "--layout-kind",
            "mla",
            "--tp-size",
            "2",
            "--mode",
            "write",
            "--num-kv-heads",
            "1",
            "--mla",
        ]
    )

    assert fingerprint_from_args(args) == Fingerprint(
        "m", "float16", 32, ("mla",) * 3, 2, TransferMode.WRITE, 1, True
    )


def test_render_counts_statuses() -> None:
    text = render(
        [Check("a", Status.PASS, "fine"), Check("long name", Status.FAIL, "bad", ("why",))]
    )

    assert text.splitlines() == [
        "PASS  a          fine",
        "FAIL  long name  bad",
        "                 why",
        "result: 1 FAIL, 0 WARN, 1 PASS",
    ]


@pytest.fixture
def fake_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor_checks, "probe_nixl", lambda loopback: "fake nixl")
    monkeypatch.setattr(doctor_checks, "probe_mori", _missing)
    monkeypatch.setenv("NIXL_LOG_LEVEL", "WARN")


@pytest.mark.usefixtures("fake_transports")
def test_doctor_exits_1_when_a_port_is_taken(
    busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["doctor", "--host", "127.0.0.1", "--ports", f"{busy_port},{_free_port()}"])

    out = capsys.readouterr().out
    assert code == 1
    assert f"FAIL  port {busy_port}" in out
    assert "PASS  transport nixl" in out
    assert "WARN  transport mori" in out


@pytest.mark.usefixtures("fake_transports")
def test_doctor_json_passes_with_free_ports(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--host", "127.0.0.1", "--ports", str(_free_port()), "--json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["ok"] is True
    assert report["peer"] is None
    assert report["counts"]["FAIL"] == 0
    assert {"name": "transport nixl", "status": "PASS", "detail": "fake nixl", "notes": []} in (
        report["checks"]
    )


def test_doctor_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--ports", "6301,x"]) == 2
    assert "moriio doctor: error: --ports" in capsys.readouterr().err
    assert main(["doctor", "--peer", "nohost"]) == 2
