"""Peers of another wire protocol version get a handshake error that names both versions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from moriio.adapters.zmq import ZmqControlChannel
from moriio.domain.protocol.codec import WIRE_CODEC, WireCodec
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    PROTOCOL_VERSION,
    HandshakeRejected,
    HandshakeRequest,
    Message,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import ControlChannelError, PeerAddress

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"


class _OtherVersion(WireCodec):
    """A peer built for another protocol version (its frames carry that ``"v"``)."""

    def __init__(self, version: int) -> None:
        self.version = version

    def encode(self, message: Message) -> dict[str, object]:
        return {**super().encode(message), "v": self.version}


def _request(control: PeerAddress) -> HandshakeRequest:
    fp = Fingerprint("m", "bfloat16", 16, ("separated",), 1, TransferMode.WRITE, 8, False)
    layer = LayerRegions("l0", (b"d",), 4, 64)
    return HandshakeRequest(fp, b"meta", (layer,), control, 0, 0, "instance-1")


@pytest.fixture
def listener() -> Iterator[ZmqControlChannel[Any]]:
    channel: ZmqControlChannel[Any] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
    channel.serve(lambda message: HandshakeRejected("fingerprint.model_name"))
    yield channel
    channel.close()


@pytest.mark.parametrize("version", [1, PROTOCOL_VERSION + 1])
def test_a_peer_of_another_version_is_told_which_versions_differ(
    listener: ZmqControlChannel[Any], version: int
) -> None:
    old: ZmqControlChannel[Any] = ZmqControlChannel(_OtherVersion(version), HOST, 0)
    try:
        with pytest.raises(ControlChannelError) as exc:
            old.request(listener.address, _request(old.address), timeout=10.0)
    finally:
        old.close()
    text = str(exc.value)
    assert f"version {version}" in text
    assert f"speaks {PROTOCOL_VERSION}" in text
    assert listener.rejected.get("invalid_message") == 1


def test_a_peer_of_this_version_still_gets_its_answer(listener: ZmqControlChannel[Any]) -> None:
    peer: ZmqControlChannel[Any] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
    try:
        reply = peer.request(listener.address, _request(peer.address), timeout=10.0)
    finally:
        peer.close()
    assert reply == HandshakeRejected("fingerprint.model_name")
