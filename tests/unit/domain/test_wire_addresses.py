"""Control addresses and router announcements: one format, one parser, errors that name the part."""

from __future__ import annotations

import pytest

from moriio.domain.params.request_ids import (
    peer_address_from_request_id,
    request_id_with_addresses,
    transfer_id_from_request_id,
)
from moriio.domain.params.transfer_params import TransferParamsError, parse_transfer_params
from moriio.domain.protocol.announcement import Announcement, AnnouncementError
from moriio.domain.values.addresses import ControlAddress, ControlAddressError, format_zmq_address
from moriio.domain.values.modes import TransferMode


@pytest.mark.parametrize(
    ("address", "text"),
    [
        (ControlAddress("10.0.0.1", 6301, 61005), "host:10.0.0.1,handshake:6301,notify:61005"),
        (ControlAddress("fd00::5", 1, 65535), "host:fd00::5,handshake:1,notify:65535"),
        (ControlAddress("node-1.local", 7, 8), "host:node-1.local,handshake:7,notify:8"),
    ],
)
def test_a_control_address_round_trips(address: ControlAddress, text: str) -> None:
    assert address.format() == text
    assert ControlAddress.parse(text) == address
    assert format_zmq_address(address.host, address.handshake_port, address.notify_port) == text


def test_the_host_is_kept_canonical() -> None:
    assert ControlAddress("Node-1.Local.", 1, 2).host == "node-1.local"
    assert ControlAddress.parse("host:0:0:0:0:0:0:0:1,handshake:1,notify:2").host == "::1"


@pytest.mark.parametrize(
    ("text", "part", "words"),
    [
        (5, "address", "must be a string"),
        ("x" * 301, "address", "at most 300"),
        ("host:10.0.0.1,handshake:6301", "notify", "lacks notify"),
        ("handshake:1,notify:2", "host", "lacks host"),
        ("host:10.0.0.1,handshake:abc,notify:2", "handshake", "handshake must be a port"),
        ("host:10.0.0.1,handshake:1,notify:70000", "notify", "notify must be a port"),
        ("host:10.0.0.1,handshake:0,notify:2", "handshake", "handshake must be a port"),
        ("host:10.0.0.1,handshake: 1,notify:2", "handshake", "handshake must be a port"),
        ("host:a b,handshake:1,notify:2", "host", "whitespace"),
        ("host:[::1],handshake:1,notify:2", "host", "neither an IP address nor a host name"),
        ("host:10.0.0.1,handshake:1,notify:2,side:3", "address", "'side:3'"),
        ("host:10.0.0.1,host:10.0.0.2,handshake:1,notify:2", "address", "repeated"),
        ("host:10.0.0.1,handshake,notify:2", "address", "'handshake'"),
    ],
)
def test_a_malformed_control_address_is_refused_naming_the_part(
    text: object, part: str, words: str
) -> None:
    with pytest.raises(ControlAddressError, match=words) as caught:
        ControlAddress.parse(text)
    assert caught.value.part == part


@pytest.mark.parametrize(
    ("args", "part"),
    [(("", 1, 2), "host"), (("h", 0, 2), "handshake"), (("h", 1, True), "notify")],
)
def test_a_control_address_is_checked_when_built(args: tuple[str, int, int], part: str) -> None:
    with pytest.raises(ControlAddressError, match=part) as caught:
        ControlAddress(*args)
    assert caught.value.part == part


def test_the_router_request_id_carries_both_addresses_and_the_transfer_id() -> None:
    prefill, decode = ControlAddress("10.0.0.1", 6301, 61005), ControlAddress("fd00::7", 1, 2)
    rid = "cmpl-" + request_id_with_addresses(prefill, decode, "ab" * 16) + "-0-1a2b3c4d"
    assert peer_address_from_request_id(rid, want_decode=False) == prefill.format()
    assert peer_address_from_request_id(rid, want_decode=True) == decode.format()
    assert transfer_id_from_request_id(rid) == "ab" * 16


@pytest.mark.parametrize(
    ("decode", "key"),
    [
        ("host:10.0.0.2,handshake:x,notify:2", "remote_handshake_port"),
        ("host:10.0.0.2,handshake:1,notify:0", "remote_notify_port"),
        ("host:10.0.0.2,handshake:1", "remote_notify_port"),
        ("host:10.0.0.2,port:1,handshake:1,notify:2", "embedded in the request id"),
    ],
)
def test_a_bad_embedded_address_names_the_param_it_stands_for(decode: str, key: str) -> None:
    rid = f"___prefill_addr_host:10.0.0.1,handshake:1,notify:2___decode_addr_{decode}_{'a' * 32}"
    with pytest.raises(TransferParamsError, match=key):
        parse_transfer_params({"do_remote_decode": True}, rid)


IN_TREE = {
    "type": "P",
    "http_address": "10.0.0.1:8100",
    "zmq_address": "host:10.0.0.1,handshake:6301,notify:61005",
    "dp_size": 2,
    "tp_size": 4,
    "transfer_mode": "WRITE",
}


def test_an_announcement_round_trips_through_its_map() -> None:
    announcement = Announcement.from_payload(IN_TREE)
    assert announcement == Announcement(
        True, "10.0.0.1", 8100, "10.0.0.1", 6301, 61005, 2, 4, TransferMode.WRITE
    )
    assert announcement.payload() == IN_TREE
    assert announcement.control == ControlAddress("10.0.0.1", 6301, 61005)
    assert Announcement.from_payload({"type": "HELLO"}) is None


def test_an_ipv6_engine_announces_a_bracketed_http_address() -> None:
    v6 = Announcement(False, "fd00::5", 8200, "fd00::5", 1, 2, 1, 1, TransferMode.READ)
    payload = v6.payload()
    assert payload["http_address"] == "[fd00::5]:8200"
    assert payload["zmq_address"] == "host:fd00::5,handshake:1,notify:2"
    assert Announcement.from_payload(payload) == v6


def test_the_older_register_form_reads_as_the_same_announcement() -> None:
    older = {
        "type": "register",
        "role": "D",
        "request_address": "http://10.0.0.2:8200/v1/completions",
        "handshake_port": "7301",
        "notify_port": 7005,
        "transfer_mode": "READ",
    }
    assert Announcement.from_payload(older) == Announcement(
        False, "10.0.0.2", 8200, "10.0.0.2", 7301, 7005, 1, 1, TransferMode.READ
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"type": "X"}, "type"),
        ({"http_address": "10.0.0.1"}, "http_address"),
        ({"http_address": "10.0.0.1:0"}, "http_address"),
        ({"http_address": "-bad-:80"}, "http_address"),
        ({"zmq_address": "host:10.0.0.1,handshake:6301"}, "zmq_address.*lacks notify"),
        ({"zmq_address": "host:10.0.0.1,handshake:1,notify:x"}, "zmq_address.*notify"),
        ({"zmq_address": None}, "zmq_address"),
        ({"dp_size": 0}, "dp_size"),
        ({"dp_size": 1025}, "dp_size"),
        ({"tp_size": "2"}, "tp_size"),
        ({"transfer_mode": "read"}, "transfer_mode"),
        ({"type": "register", "role": "X"}, "role"),
    ],
)
def test_a_malformed_announcement_is_refused_naming_the_field(
    change: dict[str, object], field: str
) -> None:
    with pytest.raises(AnnouncementError, match=field):
        Announcement.from_payload({**IN_TREE, **change})


def test_an_announcement_is_checked_when_built_too() -> None:
    with pytest.raises(AnnouncementError, match=r"zmq_address.*notify"):
        Announcement(True, "h", 1, "h", 2, 0, 1, 1, TransferMode.READ)
    with pytest.raises(AnnouncementError, match="http_address"):
        Announcement(True, "h", 70000, "h", 2, 3, 1, 1, TransferMode.READ)
    with pytest.raises(AnnouncementError, match="map"):
        Announcement.from_payload([IN_TREE])
