"""Per-step connector metadata carries what changed, not the whole live transfer map."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from moriio.domain.params.orders import StepOrders
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, ProbeReply
from moriio.testing.inmemory.channel import InMemoryControlChannel
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata
from moriio_tools.vllm_harness import model_output
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import engine_extra
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

WAVE = 16
WAVES = 5


@pytest.fixture
def decode() -> Iterator[SimEngine]:
    """A WRITE consumer whose requests wait for a producer that answers liveness probes but
    never writes: they stay live."""
    world = InMemoryWorld()
    producer: InMemoryControlChannel[Message] = InMemoryControlChannel(
        world.network, WIRE_CODEC, "127.0.0.1", 9002
    )
    producer.serve(lambda _: ProbeReply("silent-producer"))
    engine = SimEngine(
        "D",
        "kv_consumer",
        engine_extra(False, world.address()),
        num_blocks=4096,
        adapters_factory=world.adapters_factory,
        max_num_seqs=256,
    )
    yield engine
    engine.close()
    producer.close()


def _params(tid: str) -> dict[str, object]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": tid,
        "remote_host": "127.0.0.1",
        "remote_handshake_port": 9001,
        "remote_notify_port": 9002,
        "remote_tp_size": 1,
    }


def test_metadata_size_stays_flat_as_live_transfers_grow(decode: SimEngine) -> None:
    announce_sizes, quiet_sizes = [], []
    for wave in range(WAVES):
        for i in range(WAVE):
            n = wave * WAVE + i
            prompt = [1 + (n * 7 + t) % 900 for t in range(64)]
            decode.add(f"r{n:04d}", prompt, 4, _params(f"tx-{n:06d}"))
        decode.step()  # announces this wave's destination blocks
        announce_sizes.append(decode.metadata_sizes[-1])
        decode.step()
        decode.step()
        quiet_sizes.extend(decode.metadata_sizes[-2:])
        side = decode.connector.scheduler_side
        assert side is not None
        assert side.consumer is not None
        assert side.consumer.num_awaiting_write == (wave + 1) * WAVE
    assert decode.service.num_live == WAVES * WAVE
    empty = len(pickle.dumps(MoriioConnectorMetadata(StepOrders())))
    assert quiet_sizes == [empty] * len(quiet_sizes)  # 16 or 80 live: the same bytes
    # Same orders each wave; only wider pickled ints (block ids past 255) may add a byte each.
    assert max(announce_sizes) - min(announce_sizes) <= 0.1 * min(announce_sizes)
    assert announce_sizes[0] > empty  # the announcing step did carry this wave's orders


def test_each_new_transfer_is_shipped_once(decode: SimEngine) -> None:
    for n in range(8):
        decode.add(f"r{n}", [n + 1] * 40, 4, _params(f"tx-{n}"))
    shipped: list[str] = []
    for _ in range(4):
        scheduler_output = decode.scheduler.schedule()
        meta = scheduler_output.kv_connector_metadata
        assert isinstance(meta, MoriioConnectorMetadata)
        shipped += [order.transfer_id for order in meta.orders.expect_writes]
        output = model_output(decode.scheduler, scheduler_output, None)
        decode.scheduler.update_from_output(scheduler_output, output)
    assert sorted(shipped) == [f"tx-{n}" for n in range(8)]


def test_a_step_says_whether_it_computes_anything(decode: SimEngine) -> None:
    """The workers of a step that schedules no token may wait for a transfer to finish."""

    def step() -> bool:
        scheduler_output = decode.scheduler.schedule()
        meta = scheduler_output.kv_connector_metadata
        assert isinstance(meta, MoriioConnectorMetadata)
        output = model_output(decode.scheduler, scheduler_output, None)
        decode.scheduler.update_from_output(scheduler_output, output)
        return meta.computes

    decode.add("remote", [3] * 40, 4, _params("tx-remote"))
    assert [step(), step()] == [False, False]  # its KV is awaited: nothing to compute
    decode.add("local", [5] * 40, 4, None)
    assert step()  # the local prompt's prefill
    computes = MoriioConnectorMetadata(StepOrders(), computes=False)
    assert pickle.loads(pickle.dumps(computes)).computes is False
