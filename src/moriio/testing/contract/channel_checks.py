"""The contract every ControlChannel keeps, one check function per promise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import HandshakeRejected, Message, Release
from moriio.ports import ControlChannelError, Inbound, RequestTimeoutError, UntrustedPeerError
from moriio.testing.contract.channel_harness import (
    HOST,
    OTHER_HOST,
    ChannelHarness,
    Msg,
    PingCodec,
    eventually,
    ping,
    receive,
)
from moriio.testing.contract.harness import expect, raises


@dataclass(frozen=True)
class ChannelCheck:
    """One promise of the ControlChannel contract, run against a fresh harness."""

    name: str
    run: Callable[[ChannelHarness], None]


def channels_listen_on_distinct_addresses(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    expect(a.address != b.address, f"two channels share {a.address}")
    expect(a.address.host == HOST, f"{a.address} is not on {HOST}")
    expect(a.address.port > 0, f"{a.address} has no port")


def send_delivers_wire_copies_in_order_with_the_sender(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    sent = [ping(seq, blocks=(3, 4)) for seq in range(5)]
    for message in sent:
        a.send(b.address, message)
    inbound: list[Inbound[Msg]] = []
    while len(inbound) < 5 and (arrived := b.drain(timeout=5.0)):
        inbound += arrived
    expect([i.message["seq"] for i in inbound] == [0, 1, 2, 3, 4], f"got {inbound}")
    expect({i.sender for i in inbound} == {a.address}, "an inbound does not name its sender")
    expect(inbound[0].message == ping(0, blocks=[3, 4]), "not a msgpack copy of the message")
    expect(inbound[0].message is not sent[0], "the receiver got the sender's object")
    expect(b.drain() == [], "a drained message came again")


def drain_without_messages_returns_nothing(harness: ChannelHarness) -> None:
    expect(harness.channel().drain(timeout=0.01) == [], "an idle channel drained messages")


LONG_DRAIN_S = 3600.0  # a drain that only a wake (or a message) ends within the checks


def wake_ends_a_waiting_drain(harness: ChannelHarness) -> None:
    channel = harness.channel()
    drained: list[list[Inbound[Msg]]] = []
    waiter = threading.Thread(target=lambda: drained.append(channel.drain(LONG_DRAIN_S)))
    waiter.start()
    eventually(waiter.is_alive, "the drain did not start")
    channel.wake()
    waiter.join(30.0)
    expect(not waiter.is_alive(), "a drain went on waiting after wake()")
    expect(drained == [[]], f"a woken drain returned {drained}")


def wake_before_drain_ends_the_next_wait_only(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    b.wake()
    b.wake()  # wakes do not pile up: one drain takes them
    expect(b.drain(LONG_DRAIN_S) == [], "a drain after wake() returned messages")
    a.send(b.address, ping(1))
    arrived = b.drain(LONG_DRAIN_S)  # ends on the message, not on an old wake
    expect([i.message["seq"] for i in arrived] == [1], f"got {arrived}")
    b.close()
    b.wake()  # closed: does nothing, raises nothing


def request_is_answered_by_the_responder(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    b.serve(lambda m: {"type": "hello", "seq": m["seq"] + 1})
    reply = a.request(b.address, ping(41), timeout=5.0)
    expect(reply == {"type": "hello", "seq": 42}, f"reply {reply}")
    expect(a.request(b.address, ping(1), timeout=5.0)["seq"] == 2, "a second request failed")


def request_without_responder_fails_and_is_counted(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    with raises(ControlChannelError, match="no responder"):
        a.request(b.address, ping(1), timeout=10.0)
    expect(b.rejected.get("unserved_request") == 1, f"rejected {dict(b.rejected)}")


def responder_failure_fails_the_request_and_is_counted(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()

    def broken(message: Msg) -> Msg:
        raise RuntimeError("boom")

    b.serve(broken)
    with raises(ControlChannelError, match="responder failed"):
        a.request(b.address, ping(1), timeout=10.0)
    expect(b.rejected.get("responder_error") == 1, f"rejected {dict(b.rejected)}")
    expect(b.listener_alive, "a responder failure stopped the listener")
    b.serve(lambda m: m)
    expect(a.request(b.address, ping(7), timeout=5.0)["seq"] == 7, "no answer after a failure")


def malformed_reply_fails_the_request_and_is_counted(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    b.serve(lambda m: {"type": "bogus"})
    with raises(ControlChannelError, match="malformed reply"):
        a.request(b.address, ping(1), timeout=10.0)
    expect(a.rejected.get("invalid_message") == 1, f"rejected {dict(a.rejected)}")


def request_timeout_must_be_positive(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    for timeout in (0.0, -1.0, float("nan")):
        with raises(ValueError, match="timeout"):
            a.request(b.address, ping(1), timeout=timeout)


def request_to_an_absent_peer_times_out(harness: ChannelHarness) -> None:
    a, gone = harness.channel(), harness.channel()
    absent = gone.address
    gone.close()
    with raises(RequestTimeoutError, match=str(absent)):
        a.request(absent, ping(1), timeout=0.2)


def a_slow_responder_times_the_request_out(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()

    def slow(message: Msg) -> Msg:
        if message["seq"] == 1:
            time.sleep(0.5)
        return message

    b.serve(slow)
    with raises(RequestTimeoutError, match=str(b.address)):
        a.request(b.address, ping(1), timeout=0.1)
    expect(b.listener_alive, "a slow responder stopped the listener")
    reply = a.request(b.address, ping(2), timeout=10.0)
    expect(reply == ping(2), f"after a timeout the next request got {reply}")


def untrusted_hosts_are_refused_until_trusted(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel(host=OTHER_HOST)
    with raises(UntrustedPeerError, match=OTHER_HOST.replace(".", r"\.")):
        a.send(b.address, ping(1))
    with raises(UntrustedPeerError, match=OTHER_HOST.replace(".", r"\.")):
        a.request(b.address, ping(1), timeout=1.0)
    a.trust(OTHER_HOST)
    a.send(b.address, ping(2))
    expect(receive(b, 1) == [ping(2)], "a send to a host trusted since did not arrive")


def configured_trusted_hosts_may_be_dialled(harness: ChannelHarness) -> None:
    b = harness.channel(host=OTHER_HOST)
    a = harness.channel(trusted_hosts=[OTHER_HOST])
    a.send(b.address, ping(3))
    expect(receive(b, 1) == [ping(3)], "a send to a configured trusted host did not arrive")


def oversize_messages_are_refused_by_the_sender(harness: ChannelHarness) -> None:
    a, b = harness.channel(max_frame_bytes=256), harness.channel()
    with raises(ControlChannelError, match="max_frame_bytes"):
        a.send(b.address, ping(1, pad="x" * 300))
    a.send(b.address, ping(2))
    expect(receive(b, 1) == [ping(2)], "the channel stopped after refusing a message")


def messages_the_codec_refuses_are_counted_at_the_receiver(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    a.send(b.address, {"type": "unknown", "seq": 1})
    a.send(b.address, ping(4))
    expect([m["seq"] for m in receive(b, 1)] == [4], "only the valid message may arrive")
    eventually(lambda: b.rejected.get("invalid_message") == 1, "invalid_message counted")
    expect(dict(b.rejected) == {"invalid_message": 1}, f"rejected {dict(b.rejected)}")


def inbox_overflow_is_counted(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel(inbox_limit=3)
    for seq in range(5):
        a.send(b.address, ping(seq))
    eventually(lambda: b.rejected.get("inbox_overflow") == 2, "two messages over the limit")
    expect([i.message["seq"] for i in b.drain()] == [0, 1, 2], "the inbox kept the wrong ones")


def close_is_idempotent_and_refuses_new_work(harness: ChannelHarness) -> None:
    a, b = harness.channel(), harness.channel()
    expect(b.listener_alive, "a new channel does not listen")
    b.close()
    b.close()
    expect(not b.listener_alive, "a closed channel still listens")
    with raises(ControlChannelError, match="closed"):
        b.send(a.address, ping(2))
    with raises(ControlChannelError, match="closed"):
        b.request(a.address, ping(2), timeout=1.0)


def bad_configuration_is_refused(harness: ChannelHarness) -> None:
    refused: tuple[tuple[int, dict[str, int], str], ...] = (
        (-1, {}, "port"),
        (70000, {}, "port"),
        (0, {"inbox_limit": 0}, "inbox_limit"),
    )
    for port, options, match in refused:
        with raises(ValueError, match=match):
            harness.open(PingCodec(), HOST, port, **options)


def domain_wire_messages_cross_the_channel(harness: ChannelHarness) -> None:
    a, b = harness.open(WIRE_CODEC), harness.open(WIRE_CODEC)

    def reject(message: Message) -> Message:
        return HandshakeRejected(reason=f"got {type(message).__name__}")

    b.serve(reject)
    a.send(b.address, Release("transfer-7", consumer_tp_size=4))
    arrived = receive(b, 1)
    expect(arrived == [Release("transfer-7", consumer_tp_size=4)], f"got {arrived}")
    reply = a.request(b.address, Release("t", 1), timeout=10.0)
    expect(reply == HandshakeRejected(reason="got Release"), f"reply {reply}")


CHANNEL_CHECKS: tuple[ChannelCheck, ...] = tuple(
    ChannelCheck(check.__name__, check)
    for check in (
        channels_listen_on_distinct_addresses,
        send_delivers_wire_copies_in_order_with_the_sender,
        drain_without_messages_returns_nothing,
        wake_ends_a_waiting_drain,
        wake_before_drain_ends_the_next_wait_only,
        request_is_answered_by_the_responder,
        request_without_responder_fails_and_is_counted,
        responder_failure_fails_the_request_and_is_counted,
        malformed_reply_fails_the_request_and_is_counted,
        request_timeout_must_be_positive,
        request_to_an_absent_peer_times_out,
        a_slow_responder_times_the_request_out,
        untrusted_hosts_are_refused_until_trusted,
        configured_trusted_hosts_may_be_dialled,
        oversize_messages_are_refused_by_the_sender,
        messages_the_codec_refuses_are_counted_at_the_receiver,
        inbox_overflow_is_counted,
        close_is_idempotent_and_refuses_new_work,
        bad_configuration_is_refused,
        domain_wire_messages_cross_the_channel,
    )
)
