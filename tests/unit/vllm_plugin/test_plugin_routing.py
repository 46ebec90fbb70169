"""Router/proxy compatibility: the MoRIIO toy proxy's params and request-id embedded addresses."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from moriio.config.settings import ConnectorSettings
from moriio.container import SchedulerContainer, SchedulerRole
from moriio.domain.params.handoff_tags import verify
from moriio.domain.params.request_ids import peer_address_from_request_id
from moriio.domain.params.transfer_params import (
    PeerEndpoint,
    TransferParamsError,
    parse_transfer_params,
)
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.addresses import format_zmq_address
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT

P_ADDR = "host:10.1.0.5,handshake:6301,notify:61005"
D_ADDR = "host:10.2.0.7,handshake:6401,notify:61105"
HEX = "0123456789abcdef0123456789abcdef"
ROUTER_ID = f"___prefill_addr_{P_ADDR}___decode_addr_{D_ADDR}_{HEX}"
# vLLM adds its own prefix/suffixes to the id the router chose.
VLLM_IDS = [ROUTER_ID, f"{ROUTER_ID}-0-1a2b3c4d", f"cmpl-{ROUTER_ID}-3-deadbeef"]

# What the toy proxy sends to the prefill engine (READ and WRITE).
PROXY_TO_P: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "transfer_id": "tx-1",
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_dp_size": 1,
    "remote_tp_size": 2,
}
# What it sends to the decode engine in WRITE mode (no peer address: it is in the id).
PROXY_TO_D: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "transfer_id": "tx-1",
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_dp_size": 1,
    "remote_tp_size": 4,
}


@pytest.mark.parametrize("request_id", VLLM_IDS, ids=["router", "seq-suffix", "cmpl"])
def test_producer_finds_the_decode_address_in_the_request_id(request_id: str) -> None:
    params = parse_transfer_params(PROXY_TO_P, request_id)
    assert params is not None
    assert params.do_remote_decode
    assert params.remote_block_ids is None
    assert params.peer == PeerEndpoint("10.2.0.7", 6401, 61105, tp_size=2, dp_size=1)


@pytest.mark.parametrize("request_id", VLLM_IDS, ids=["router", "seq-suffix", "cmpl"])
def test_consumer_finds_the_prefill_address_in_the_request_id(request_id: str) -> None:
    params = parse_transfer_params(PROXY_TO_D, request_id)
    assert params is not None
    assert params.do_remote_prefill
    assert params.peer == PeerEndpoint("10.1.0.5", 6301, 61005, tp_size=4, dp_size=1)


def test_read_mode_decode_params_copied_from_the_prefill_response() -> None:
    returned = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": "tx-9",
        "remote_block_ids": [[7, 8, 9]],
        "remote_engine_id": "10.1.0.5:6301",
        "remote_dp_size": 1,
        "remote_tp_size": 1,
    }
    params = parse_transfer_params(returned, f"{ROUTER_ID}-1-00ff00ff")
    assert params is not None
    assert params.remote_block_ids == ((7, 8, 9),)
    assert params.peer is not None
    assert params.peer.host == "10.1.0.5"
    assert params.peer.engine_id == "10.1.0.5:6301"
    assert params.lease_expires_at is None  # the toy proxy does not forward a lease
    assert params.peer.instance_id is None  # nor the instance: reads are not checked then


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"remote_host": "10.9.9.9"}, ("10.9.9.9", 6301, 61005)),
        ({"remote_handshake_port": 7001}, ("10.1.0.5", 7001, 61005)),
        ({"remote_notify_port": 7002}, ("10.1.0.5", 6301, 7002)),
        (
            {"remote_host": "h", "remote_handshake_port": "7003", "remote_notify_port": 7004},
            ("h", 7003, 7004),
        ),
    ],
)
def test_explicit_params_override_embedded_addresses(
    override: dict[str, Any], expected: tuple[str, int, int]
) -> None:
    params = parse_transfer_params({**PROXY_TO_D, **override}, f"{ROUTER_ID}-0-1a2b3c4d")
    assert params is not None
    assert params.peer is not None
    peer = params.peer
    assert (peer.host, peer.handshake_port, peer.notify_port) == expected


def test_explicit_params_alone_need_no_embedded_address() -> None:
    params = parse_transfer_params(
        {
            **PROXY_TO_D,
            "remote_host": "10.3.3.3",
            "remote_handshake_port": 1,
            "remote_notify_port": 2,
        },
        "plain-request-id",
    )
    assert params is not None
    assert params.peer == PeerEndpoint("10.3.3.3", 1, 2, tp_size=4)


def test_no_address_anywhere_means_no_peer() -> None:
    params = parse_transfer_params(PROXY_TO_D, f"cmpl-{uuid.uuid4().hex}-0-1a2b3c4d")
    assert params is not None
    assert params.peer is None


def test_ipv6_hosts_survive() -> None:
    p6 = format_zmq_address("fd00::5", 6301, 61005)
    d6 = format_zmq_address("fd00::7", 6401, 61105)
    request_id = f"___prefill_addr_{p6}___decode_addr_{d6}_{HEX}-0-1a2b3c4d"
    assert peer_address_from_request_id(request_id, want_decode=False) == p6
    assert peer_address_from_request_id(request_id, want_decode=True) == d6
    params = parse_transfer_params(PROXY_TO_P, request_id)
    assert params is not None
    assert params.peer is not None
    assert params.peer.host == "fd00::7"


def test_request_id_without_the_uuid_has_no_decode_address() -> None:
    request_id = f"___prefill_addr_{P_ADDR}___decode_addr_{D_ADDR}_not-hex"
    assert peer_address_from_request_id(request_id, want_decode=True) is None
    assert peer_address_from_request_id(request_id, want_decode=False) == P_ADDR


@pytest.mark.parametrize(
    ("address", "missing"),
    [
        ("host:10.1.0.5,handshake:6301", "notify"),
        ("handshake:6301,notify:61005", "host"),
    ],
)
def test_incomplete_embedded_address_is_refused_naming_the_field(
    address: str, missing: str
) -> None:
    request_id = f"___prefill_addr_{address}___decode_addr_{D_ADDR}_{HEX}"
    with pytest.raises(TransferParamsError, match=missing):
        parse_transfer_params(PROXY_TO_D, request_id)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({**PROXY_TO_D, "transfer_id": ""}, "transfer_id"),
        ({**PROXY_TO_D, "do_remote_prefill": "yes"}, "do_remote_prefill"),
        ({**PROXY_TO_D, "remote_block_ids": [[1], 2]}, "remote_block_ids"),
        ({**PROXY_TO_D, "remote_block_ids": [-1]}, "remote_block_ids"),
        ({**PROXY_TO_D, "remote_tp_size": "2"}, "remote_tp_size"),
        ({**PROXY_TO_D, "remote_notify_port": 0}, "remote_notify_port"),
        ({**PROXY_TO_D, "remote_instance_id": ""}, "remote_instance_id"),
        ({**PROXY_TO_D, "remote_instance_id": 17}, "remote_instance_id"),
        ({**PROXY_TO_D, "remote_instance_id": "i" * 257}, "remote_instance_id"),
    ],
)
def test_malformed_params_are_refused_naming_the_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(TransferParamsError, match=key):
        parse_transfer_params(params, ROUTER_ID)


def test_requests_outside_pd_have_no_params() -> None:
    assert parse_transfer_params(None, ROUTER_ID) is None
    assert parse_transfer_params({}, ROUTER_ID) is None
    assert parse_transfer_params({"do_remote_prefill": False}, ROUTER_ID) is None


def test_the_producer_instance_travels_from_the_returned_params_to_the_read_order() -> None:
    read = ConnectorSettings(mode=TransferMode.READ)
    prefill = SchedulerContainer(
        settings=read,
        role=SchedulerRole(is_producer=True, is_consumer=False),
        endpoint=LocalEndpoint("10.1.0.5:6301", "10.1.0.5", 6301, 61005, 1, 1, 0, "1700000000123"),
        block_size=16,
        policy=TransferPolicy(transfer_timeout=10.0, defer_timeout=30.0),
    )
    book = prefill.producer_book()
    assert isinstance(book, ReadProducerBook)
    returned = parse_transfer_params(PROXY_TO_P, ROUTER_ID, producer_peer=False)
    book.on_allocated("p-1", returned)
    decision = book.on_finished(
        "p-1",
        length_capped=True,
        block_ids=[4, 5],
        wall_now=100.0,
        now=1.0,
        params=returned,
        prompt=PROMPT,
    )
    assert decision.params is not None
    assert decision.params["remote_instance_id"] == "1700000000123"
    params = parse_transfer_params(decision.params, "d-1")
    assert params is not None
    assert params.peer is not None
    assert params.peer.instance_id == "1700000000123"
    decode = SchedulerContainer(
        settings=read, role=SchedulerRole(is_producer=False, is_consumer=True), block_size=16
    )
    consumer = decode.consumer_book()
    consumer.match("d-1", params, 40, 0)
    consumer.on_allocated("d-1", params, [9, 10, 11], 32, PROMPT)
    (order,) = consumer.take_orders().reads
    assert order.peer.instance_id == "1700000000123"
    # The read order carries what the decode's worker verifies: the prefill signed it.
    assert order.handoff is not None
    assert verify(book.handoff_key, "1700000000123", order.handoff) is None
    # Another instance of the same engine is another peer (the parse cache keeps them apart).
    other = parse_transfer_params({**decision.params, "remote_instance_id": "17"}, "d-2")
    assert other is not None
    assert other.peer is not None
    assert other.peer.instance_id == "17"
