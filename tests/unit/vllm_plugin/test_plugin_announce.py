"""Who announces itself to a router, with what, where it listens, and a heartbeat that keeps
beating while the engine's interpreter is held."""

from __future__ import annotations

import ctypes
import itertools
import subprocess
import sys
import textwrap
import time

import msgpack
import pytest

from moriio.config.settings import ConnectorSettings, SettingsError, parse_settings
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.router.registry import parse_announcement
from moriio.vllm_plugin.discovery import start_heartbeat, trust_warning
from moriio.vllm_plugin.identity import listen_host
from moriio_tools.harness import free_ports


def _settings(port: int, **extra: object) -> ConnectorSettings:
    return parse_settings(
        {
            "proxy_ip": "127.0.0.1",
            "proxy_ping_port": port,
            "proxy_ping_interval": 1.0,
            "http_port": 8100,
            **extra,
        }
    )


def _endpoint(dp_rank: int) -> LocalEndpoint:
    return LocalEndpoint("127.0.0.1:6301", "127.0.0.1", 6301, 61005, 2, 4, dp_rank, "p", 2)


def test_listen_host_is_all_interfaces_unless_one_address_is_given() -> None:
    default = parse_settings({})
    assert default.listen_host is None
    assert listen_host(default, "10.0.0.5") == "0.0.0.0"
    assert listen_host(default, "fd00::5") == "::"
    star = parse_settings({"listen_host": "*"})
    assert listen_host(star, "10.0.0.5") == "0.0.0.0"
    one = parse_settings({"listen_host": "10.0.0.5"})
    assert listen_host(one, "10.0.0.7") == "10.0.0.5"


@pytest.mark.parametrize("value", ["eth0", "10.0.0.5 ", 5, "", "pod.example"])
def test_a_listen_host_that_is_no_address_is_refused(value: object) -> None:
    with pytest.raises(SettingsError, match="listen_host"):
        parse_settings({"listen_host": value})


def test_only_global_dp_rank_zero_announces_itself() -> None:
    (port,) = free_ports(1)
    settings = _settings(port)
    assert start_heartbeat(settings, _endpoint(1), is_producer=True) is None
    heartbeat = start_heartbeat(settings, _endpoint(0), is_producer=True)
    assert heartbeat is not None
    heartbeat.stop()
    assert not heartbeat.alive


def test_a_router_on_another_host_with_no_trusted_peers_is_warned_about() -> None:
    lonely = ConnectorSettings(proxy_ip="10.0.0.9", proxy_ping_port=36367, http_port=8100)
    warning = trust_warning(lonely, "10.0.0.5")
    assert warning is not None
    assert "trusted_remote_hosts" in warning
    for settings in (
        ConnectorSettings(
            proxy_ip="10.0.0.9", proxy_ping_port=1, http_port=1, trusted_remote_hosts=("10/8",)
        ),
        ConnectorSettings(proxy_ip="10.0.0.9", proxy_ping_port=1, http_port=1, trust_any_host=True),
        ConnectorSettings(proxy_ip="127.0.0.1", proxy_ping_port=1, http_port=1),
        ConnectorSettings(proxy_ip="10.0.0.5", proxy_ping_port=1, http_port=1),
        ConnectorSettings(),
    ):
        assert trust_warning(settings, "10.0.0.5") is None


# A ping port in a process of its own: prints when each announcement arrived.
_LISTENER = textwrap.dedent(
    """
    import sys, time, zmq
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        if sock.poll(100):
            frames = sock.recv_multipart()
            print(time.monotonic(), frames[-1].hex(), flush=True)
    """
)


VLLM_ROUTER_SILENCE_CUTOFF_S = 5.0  # vllm-router drops an instance silent this long


@pytest.mark.integration
def test_the_heartbeat_keeps_beating_while_the_engine_holds_its_interpreter_for_six_seconds() -> (
    None
):
    """vllm-router drops an instance after 5 s of silence; a native call that holds the GIL
    for 6 s must not silence the engine."""
    (port,) = free_ports(1)
    listener = subprocess.Popen(
        [sys.executable, "-c", _LISTENER, str(port), "11"], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)  # the listener binds
    heartbeat = start_heartbeat(_settings(port), _endpoint(0), is_producer=False)
    assert heartbeat is not None
    try:
        time.sleep(1.5)
        held_from = time.monotonic()
        ctypes.PyDLL(None).sleep(6)  # libc sleep(6), called without releasing the GIL
        held_until = time.monotonic()
        time.sleep(1.5)
    finally:
        heartbeat.stop()
    out, _ = listener.communicate(timeout=30)
    arrivals = [
        (float(t), bytes.fromhex(p)) for t, p in (line.split() for line in out.split("\n") if line)
    ]
    assert held_until - held_from >= 5.9
    during = [t for t, _ in arrivals if held_from <= t <= held_until]
    assert during  # the engine was heard while it held its interpreter
    # What vllm-router needs: no silence as long as its cutoff. A beat a second leaves a
    # loaded machine 4 s of lateness before that; a beat stalled with the engine would
    # leave a gap of at least the 6 s hold.
    times = [t for t, _ in arrivals]
    assert max(b - a for a, b in itertools.pairwise(times)) < VLLM_ROUTER_SILENCE_CUTOFF_S
    announced = parse_announcement(msgpack.unpackb(arrivals[0][1]))
    assert announced is not None
    assert (announced.role, announced.dp_size, announced.tp_size) == ("D", 4, 2)
    assert announced.transfer_mode == TransferMode.WRITE.name
