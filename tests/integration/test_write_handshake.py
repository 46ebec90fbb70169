"""WRITE: the prefill handshakes with an announcing decode off its worker's path.

An announcement whose reply address never answers must not hold up the prefill's other
transfers: the push waits for its handshake in the background and fails on its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from moriio.adapters.zmq import ZmqControlChannel
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, RemoteBlocks
from moriio.domain.values.capability import new_token
from moriio.ports import PeerAddress
from moriio.vllm_plugin.prompt_binding import PromptBinder
from moriio_tools.vllm_harness import BLOCK_SIZE, make_request
from support.pd.routing import HOST, new_transfer_id, prefill_params
from support.pd.sim_proxy import PDProxy, build_pd
from support.pd.worlds import NixlWorld, free_tcp_port

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(120)]

PROMPT = list(range(1, 70))  # four full blocks and one partial
EXTRA = {"handshake_timeout": 3.0, "handshake_retry_after": 60.0, "handshake_max_retry_after": 60.0}


@pytest.fixture
def write_pd() -> Iterator[PDProxy]:
    world = NixlWorld()
    proxy = build_pd(world, False, num_blocks=256, extra=EXTRA)
    yield proxy
    world.close()
    proxy.close()


@pytest.fixture
def announcer() -> Iterator[ZmqControlChannel[Message]]:
    channel: ZmqControlChannel[Message] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
    yield channel
    channel.close()


def test_an_unanswering_decode_delays_no_other_push(
    write_pd: PDProxy, announcer: ZmqControlChannel[Message]
) -> None:
    prefill = write_pd.prefill
    tid = new_transfer_id()
    prefill.add("p-bad", PROMPT, 1, prefill_params(tid))
    closed = PeerAddress(HOST, free_tcp_port())  # nothing listens there
    # Announced for the prompt the prefill computes (a decode's binding of the same tokens).
    prompt = PromptBinder("sha256", BLOCK_SIZE).bind(
        make_request("r", PROMPT, 1, None), len(PROMPT)
    )
    blocks = RemoteBlocks(
        tid, "r", (1, 2), 0, 0, 0, 1, closed, "i", time.time() + 30, new_token(), prompt=prompt
    )
    announcer.send(PeerAddress(HOST, write_pd.prefill_address.notify_port), blocks)
    for _ in range(200):
        prefill.step()
        if prefill.service.ctx.peers.num_pending_handshakes:
            break
        time.sleep(0.01)  # the announcement travels over a real socket
    peers = prefill.service.ctx.peers
    assert peers.num_pending_handshakes == 1  # the bad push waits for its handshake
    write_pd.submit("good", PROMPT, 4)
    bad_waited = False
    for _ in range(400):
        write_pd.step()
        if "good" in write_pd.done:
            bad_waited = peers.num_pending_handshakes == 1
            break
    assert write_pd.done["good"].finish_reason == FinishReason.LENGTH
    assert write_pd.decode.stats.mismatched_blocks == 0
    assert bad_waited  # the good transfer ended while the bad handshake was still out
    for _ in range(2000):
        if prefill.finished_sending["p-bad"]:
            break
        prefill.step()
        time.sleep(0.005)  # the handshake times out in real time
    assert prefill.finished_sending["p-bad"] == 1  # failed on its own, blocks freed
    assert peers.handshake_failures == 1
    assert prefill.service.num_live == 0
