"""The router: registration (MoRIIO toy proxy protocol) and the request flow it builds."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import msgpack
import pytest
from aiohttp import web

from moriio.config.settings import ConnectorSettings, SettingsError, parse_settings
from moriio.domain.params.request_ids import peer_address_from_request_id
from moriio.domain.params.transfer_params import (
    TransferParamsError,
    parse_transfer_params,
)
from moriio.domain.protocol.announcement import Announcement, AnnouncementError
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.router.app import Router
from moriio.router.legs import decode_body, prefill_body, request_id
from moriio.router.ping import PingListener
from moriio.router.registry import Instance, Registry, parse_announcement
from moriio.vllm_plugin.discovery import start_heartbeat
from moriio_tools.harness import free_ports

# What vLLM 0.32's in-tree MoRIIO connector sends (moriio_connector._start_heartbeat).
IN_TREE_PAYLOAD = {
    "type": "P",
    "http_address": "10.0.0.1:8100",
    "zmq_address": "host:10.0.0.1,handshake:6301,notify:61005",
    "dp_size": 1,
    "tp_size": 2,
    "transfer_mode": "READ",
}


def test_the_in_tree_payload_registers_an_instance() -> None:
    instance = parse_announcement(IN_TREE_PAYLOAD)
    assert instance == Instance("P", "10.0.0.1", 8100, "10.0.0.1", 6301, 61005, 1, 2, "READ")
    assert instance.url == "http://10.0.0.1:8100"
    assert instance.zmq_address == IN_TREE_PAYLOAD["zmq_address"]


def test_our_announcement_is_the_in_tree_payload_key_for_key() -> None:
    ours = Announcement(True, "10.0.0.1", 8100, "10.0.0.1", 6301, 61005, 1, 2, TransferMode.READ)
    assert ours.payload() == IN_TREE_PAYLOAD
    decode = Announcement(False, "h", 1, "h", 2, 3, 1, 1, TransferMode.WRITE).payload()
    assert (decode["type"], decode["transfer_mode"]) == ("D", "WRITE")


def test_the_older_register_form_and_hello() -> None:
    older = {
        "type": "register",
        "role": "D",
        "request_address": "http://10.0.0.2:8200/v1/completions",
        "handshake_port": 7301,
        "notify_port": 7005,
        "dp_size": 1,
        "tp_size": 1,
        "transfer_mode": "WRITE",
    }
    instance = parse_announcement(older)
    assert instance is not None
    assert (instance.role, instance.url, instance.notify_port) == (
        "D",
        "http://10.0.0.2:8200",
        7005,
    )
    assert parse_announcement({"type": "HELLO"}) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"type": "X"}, "type"),
        ({"http_address": "10.0.0.1"}, "http_address"),
        ({"http_address": "10.0.0.1 :80"}, "http_address"),
        ({"http_address": "10.0.0.1:70000"}, "http_address"),
        ({"zmq_address": "host:10.0.0.1,handshake:6301"}, "zmq_address"),
        ({"zmq_address": "host:a b,handshake:1,notify:2"}, "zmq_address"),
        ({"zmq_address": 5}, "zmq_address"),
        ({"dp_size": 0}, "dp_size"),
        ({"tp_size": True}, "tp_size"),
        ({"transfer_mode": "PUSH"}, "transfer_mode"),
    ],
)
def test_malformed_announcements_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(AnnouncementError, match=field):
        parse_announcement({**IN_TREE_PAYLOAD, **change})
    with pytest.raises(AnnouncementError):
        parse_announcement(["not", "a", "map"])


def test_the_registry_refuses_a_second_transfer_mode() -> None:
    registry = Registry()
    read = parse_announcement(IN_TREE_PAYLOAD)
    write = parse_announcement({**IN_TREE_PAYLOAD, "type": "D", "transfer_mode": "WRITE"})
    assert read is not None
    assert write is not None
    assert registry.add(read)
    assert registry.add(read)  # heartbeats repeat: still one instance
    assert not registry.add(write)
    assert registry.to_json() == {
        "transfer_mode": "READ",
        "prefill": ["http://10.0.0.1:8100"],
        "decode": [],
        "stale": [],
        "rejected": 1,
    }


def test_an_instance_silent_for_too_long_gets_no_requests_until_it_announces_again() -> None:
    now = [100.0]
    registry = Registry(stale_after_s=10.0, clock=lambda: now[0])
    router = Router(registry, None)
    prefill = parse_announcement(IN_TREE_PAYLOAD)
    decode = parse_announcement({**IN_TREE_PAYLOAD, "type": "D", "http_address": "10.0.0.2:8200"})
    assert prefill is not None
    assert decode is not None
    assert asyncio.run(router.health(cast(web.Request, None))).status == 503
    registry.add(prefill)
    registry.add(decode)
    assert asyncio.run(router.health(cast(web.Request, None))).status == 200
    now[0] += 9.0
    registry.add(decode)  # the decode engine keeps announcing itself; the prefill went silent
    now[0] += 2.0
    assert registry.snapshot() == ([], [decode], "READ")
    assert registry.to_json()["stale"] == ["http://10.0.0.1:8100"]
    response = asyncio.run(router.handle(cast(web.Request, None)))  # refused before the body
    assert response.status == 503
    assert "have not announced themselves for over 10 s" in cast(web.Response, response).text
    registry.add(prefill)
    assert registry.snapshot() == ([prefill], [decode], "READ")
    assert asyncio.run(router.health(cast(web.Request, None))).status == 200


@pytest.mark.parametrize("stale_after", [0.0, -1.0, float("inf"), float("nan")])
def test_a_stale_after_that_is_no_positive_duration_is_refused(stale_after: float) -> None:
    with pytest.raises(ValueError, match="stale_after_s"):
        Registry(stale_after_s=stale_after)


def test_an_engine_heartbeat_registers_with_a_live_ping_port() -> None:
    """The connector's own heartbeat thread and the router's listener, over real ZMQ."""
    registry = Registry()
    (port,) = free_ports(1)
    listener = PingListener(registry, "127.0.0.1", port)
    listener.start()
    settings = ConnectorSettings(
        mode=TransferMode.WRITE,
        proxy_ip="127.0.0.1",
        proxy_ping_port=port,
        proxy_ping_interval=0.05,
        http_port=8200,
    )
    endpoint = LocalEndpoint("127.0.0.1:7301", "127.0.0.1", 7301, 7005, 1, 1, 0, "d")
    heartbeat = start_heartbeat(settings, endpoint, is_producer=False)
    assert heartbeat is not None
    try:
        deadline = time.monotonic() + 10.0
        while not registry.decode and time.monotonic() < deadline:
            time.sleep(0.02)
        listener.handle(b"\xc1 not msgpack")  # garbage on the ping port is counted, not fatal
        listener.handle(msgpack.packb({**IN_TREE_PAYLOAD, "dp_size": -1}))
    finally:
        heartbeat.stop()
        listener.stop()
    assert registry.to_json()["decode"] == ["http://127.0.0.1:8200"]
    assert registry.decode[0].zmq_address == "host:127.0.0.1,handshake:7301,notify:7005"
    assert registry.transfer_mode == "WRITE"
    assert registry.rejected == 2
    assert heartbeat.sent >= 1
    assert not heartbeat.alive


def test_no_router_configured_no_heartbeat() -> None:
    endpoint = LocalEndpoint("h:1", "h", 1, 2, 1, 1, 0, "i")
    assert start_heartbeat(ConnectorSettings(), endpoint, is_producer=True) is None


def _pair() -> tuple[Instance, Instance]:
    prefill = Instance("P", "10.0.0.1", 8100, "10.0.0.1", 6301, 61005, 1, 1, "READ")
    decode = Instance("D", "10.0.0.2", 8200, "10.0.0.2", 7301, 7005, 1, 1, "READ")
    return prefill, decode


def test_the_request_id_carries_both_addresses_as_the_toy_proxy_does() -> None:
    prefill, decode = _pair()
    rid = "cmpl-" + request_id(prefill, decode, "ab" * 16) + "-0-1234abcd"
    assert peer_address_from_request_id(rid, want_decode=False) == prefill.zmq_address
    assert peer_address_from_request_id(rid, want_decode=True) == decode.zmq_address


def test_prefill_and_decode_bodies_parse_as_transfer_params() -> None:
    prefill, decode = _pair()
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 16, "stream": True}
    to_prefill = prefill_body(body, decode, "t" * 8)
    assert (to_prefill["max_tokens"], to_prefill["stream"]) == (1, False)
    assert body["max_tokens"] == 16  # the client's body is not changed
    p_params = parse_transfer_params(to_prefill["kv_transfer_params"], "p-1")
    assert p_params is not None
    assert p_params.do_remote_decode
    assert p_params.transfer_id == "t" * 8
    returned = {"remote_block_ids": [4, 5], "remote_engine_id": "10.0.0.1:6301"}
    to_decode = decode_body(body, prefill, "t" * 8, returned)
    assert to_decode["max_tokens"] == 16
    d_params = parse_transfer_params(to_decode["kv_transfer_params"], "d-1")
    assert d_params is not None
    assert d_params.do_remote_prefill
    assert d_params.peer is not None
    assert (d_params.peer.host, d_params.peer.handshake_port) == ("10.0.0.1", 6301)


def test_a_clients_kv_transfer_params_never_reach_an_engine() -> None:
    """Neither at the top level nor under ``vllm_xargs`` (vLLM reads them from both)."""
    prefill, decode = _pair()
    smuggled = {"do_remote_prefill": True, "remote_block_ids": [[1, 2, 3]], "transfer_id": "x"}
    body = {
        "model": "m",
        "prompt": "hi",
        "kv_transfer_params": smuggled,
        "vllm_xargs": {"kv_transfer_params": smuggled, "other": 1},
    }
    returned = {"remote_block_ids": [[4, 5]], "remote_engine_id": "10.0.0.1:6301"}
    for leg in (
        prefill_body(body, decode, "t" * 8),
        decode_body(body, prefill, "t" * 8, returned),
        decode_body(body, prefill, "t" * 8, None),
    ):
        assert leg["vllm_xargs"] == {"other": 1}
        params = leg["kv_transfer_params"]
        assert params["transfer_id"] == "t" * 8
        assert params["remote_block_ids"] != smuggled["remote_block_ids"]
    assert body["vllm_xargs"]["kv_transfer_params"] is smuggled  # the client's body unchanged


def test_a_router_without_transfer_ids_still_pairs_the_two_legs() -> None:
    """Older toy proxies set no transfer_id: both legs share the request id's 32 hex digits."""
    prefill, decode = _pair()
    rid = request_id(prefill, decode, "cd" * 16)
    to_prefill = prefill_body({"prompt": [1]}, decode, "unused")["kv_transfer_params"]
    del to_prefill["transfer_id"]
    p_params = parse_transfer_params(to_prefill, f"cmpl-{rid}-0-1a2b3c4d")
    assert p_params is not None
    assert p_params.transfer_id == "cd" * 16
    # Without one in the request id either, the producer names the transfer (llm-d nixlv2)...
    plain = parse_transfer_params(to_prefill, "cmpl-plain-request-0-1a2b3c4d")
    assert plain is not None
    assert plain.transfer_id == "sidecar-cmpl-plain-request-0-1a2b3c4d"
    # ...but a consumer cannot guess the producer's name: it is refused.
    to_decode = decode_body({"prompt": [1]}, prefill, "unused", None)["kv_transfer_params"]
    del to_decode["transfer_id"]
    with pytest.raises(TransferParamsError, match="transfer_id"):
        parse_transfer_params(to_decode, "cmpl-plain-request-0-1a2b3c4d")


@pytest.mark.parametrize("host", ["10.0.0.9 ", "10.0.0.9\n", "a b", "[::1]", 7])
def test_a_router_address_that_is_no_host_is_refused_at_start_up(host: object) -> None:
    with pytest.raises(SettingsError, match="proxy_ip"):
        parse_settings({"proxy_ip": host, "proxy_ping_port": 36367, "http_port": 8100})
