"""``moriio doctor``: ports in the ephemeral range, and a peer port nothing listens on."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from moriio.doctor.checks import Status, ephemeral_range, port_checks
from moriio.doctor.peer import check_peer, probe_port
from moriio.ports import PeerAddress


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def range_file(tmp_path: Path) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    return path


def test_the_ephemeral_range_is_read_from_the_kernel_file(range_file: Path) -> None:
    assert ephemeral_range(range_file) == (32768, 60999)
    assert ephemeral_range(range_file.parent / "absent") is None


def test_a_free_port_in_the_ephemeral_range_warns(range_file: Path) -> None:
    inside, outside = _closed_port(), 6301
    if not 32768 <= inside <= 60999:
        pytest.skip("the kernel handed out a port outside the usual range")
    checks = port_checks("127.0.0.1", [inside, outside], range_file=range_file)
    assert [c.status for c in checks] in (
        [Status.WARN, Status.PASS],
        [Status.WARN, Status.FAIL],  # something on this host holds 6301
    )
    assert "in the ephemeral range 32768-60999" in checks[0].detail
    assert "use a port outside the range" in checks[0].notes[0]


def test_a_port_nothing_listens_on_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = PeerAddress("127.0.0.1", _closed_port())
    refused = probe_port(peer, 5.0)
    assert refused is not None
    assert refused.status is Status.FAIL
    assert refused.detail.startswith("connection refused: nothing listens there")

    def no_engine(*_args: object) -> object:
        raise AssertionError("a transfer engine was started for an unreachable peer")

    monkeypatch.setattr("moriio.doctor.peer.make_engine", no_engine)
    started = time.monotonic()
    report = check_peer(
        peer,
        fingerprint=None,  # type: ignore[arg-type]  # never reached
        transport="nixl",
        bind_host="127.0.0.1",
        timeout=5.0,
        secret=None,
        max_read_bytes=1,
    )
    assert time.monotonic() - started < 2.0
    assert [c.detail for c in report.checks] == [refused.detail]


def test_a_listening_port_passes_the_probe() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert probe_port(PeerAddress("127.0.0.1", sock.getsockname()[1]), 1.0) is None
