"""Fault runs: real vLLM schedulers for P and D, our connector, in-memory fakes under chaos.

Whatever goes wrong, every run ends the same way: every request finished (successfully or with
an error reason), both engines have every block free, the connector tracks nothing, no run
hangs (steps are bounded) and the failures show in the connector's KVConnectorStats as vLLM's
KV-transfer logger accumulates them.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("vllm")

from dependency_injector import providers
from vllm.v1.engine import FinishReason

from moriio.adapters.chaos import ChannelFault, ChannelFaultPlan, ChaosControlChannel
from moriio.bootstrap import WorkerIdentity
from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.messages import Message, Release, RemoteBlocks, WriteDone
from moriio.testing.handoffs import signed_params
from moriio.testing.inmemory.wiring import InMemoryAdapters
from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import PDProxy, build_pd, drive, random_workload
from support.pd.worlds import InMemoryWorld

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(60)]

# Short deadlines so that expiry paths run in about a second of wall time.
FAST = {
    "transfer_timeout": 0.5,
    "defer_timeout": 1.0,
    "clock_skew_allowance": 0.1,
    "quarantine_timeout": 0.5,
}
MODES = pytest.mark.parametrize("read_mode", [True, False], ids=["read", "write"])
PROMPT = list(range(1, 70))  # four full blocks and one partial


class ChaosWorld(InMemoryWorld):
    """The in-memory world with every notify channel under a chaos wrapper, quiet until set."""

    def adapters(
        self, settings: ConnectorSettings, identity: WorkerIdentity, secret: bytes | None
    ) -> InMemoryAdapters:
        adapters = super().adapters(settings, identity, secret)
        wrapped: ChaosControlChannel[Message] = ChaosControlChannel(
            adapters.notify_channel(),
            random.Random(identity.engine_name),
            ChannelFaultPlan(),
            self.clock,
        )
        adapters.notify_channel.override(providers.Object(wrapped))
        return adapters


def chaos(engine: SimEngine) -> ChaosControlChannel[Message]:
    """The chaos wrapper of ``engine``'s notify channel (in a :class:`ChaosWorld`)."""
    channel = engine.adapters.notify_channel()
    assert isinstance(channel, ChaosControlChannel)
    return channel


def _builder(world: InMemoryWorld) -> Iterator[Callable[..., PDProxy]]:
    built: list[PDProxy] = []

    def make(read_mode: bool, **kwargs: object) -> PDProxy:
        proxy = build_pd(world, read_mode, **kwargs)  # type: ignore[arg-type]
        built.append(proxy)
        return proxy

    yield make
    for proxy in built:
        proxy.close()
    world.close()


@pytest.fixture
def make_pd() -> Iterator[Callable[..., PDProxy]]:
    yield from _builder(InMemoryWorld())


@pytest.fixture
def make_chaos_pd() -> Iterator[Callable[..., PDProxy]]:
    yield from _builder(ChaosWorld())


def _mover(proxy: PDProxy) -> SimEngine:
    """The engine that posts the transfers: D pulls in READ mode, P pushes in WRITE mode."""
    return proxy.decode if proxy.read_mode else proxy.prefill


def _reasons(proxy: PDProxy) -> Counter[FinishReason]:
    return Counter(output.finish_reason for output in proxy.done.values())


def _assert_end_state(proxy: PDProxy) -> None:
    assert proxy.leftovers() == []
    assert not proxy.busy()
    assert proxy.decode.stats.mismatched_blocks == 0


def _step_until(proxy: PDProxy, done: Callable[[], bool], *, max_steps: int = 50) -> None:
    for _ in range(max_steps):
        if done():
            return
        proxy.step()
    raise AssertionError(f"condition not reached in {max_steps} steps: {proxy.describe()}")


def _prefill_until_done(proxy: PDProxy, key: str, *, max_steps: int = 50) -> None:
    for _ in range(max_steps):
        if key in proxy.prefill_done:
            return
        proxy.step_prefill()
    raise AssertionError(f"prefill of {key} not done in {max_steps} steps")


# -- backpressure, failures, hangs ----------------------------------------------------------


@MODES
def test_backpressure_bursts_are_retried_until_every_request_succeeds(
    make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=2048)
    engine = _mover(proxy).transfer_engine
    bursts_left = [150]

    def burst(step: int) -> None:
        # Bursts end, as a full send queue drains: injected forever, they would meet every
        # retry of the last batches once no other post is left to absorb them (persistent
        # backpressure ends at the transfer deadline, tested in the unit tier).
        if step % 3 == 0 and bursts_left[0] > 0:
            bursts_left[0] -= 1
            engine.inject_backpressure(5)

    drive(
        proxy, random_workload(seed=11, count=120, max_len=200), concurrency=32, before_step=burst
    )
    assert _reasons(proxy) == {FinishReason.LENGTH: 120}
    assert proxy.decode.stats.verified_blocks > 0
    assert not proxy.decode.stats.load_errors
    stats = _mover(proxy).transfer_stats()
    assert stats["backpressure_events"] > 0
    assert stats["retries"] > 0
    assert stats["failed"] == 0
    _assert_end_state(proxy)


@MODES
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_failed_transfers_become_load_errors_and_free_the_producer(
    make_pd: Callable[..., PDProxy], read_mode: bool, policy: str
) -> None:
    proxy = make_pd(read_mode, num_blocks=2048, kv_load_failure_policy=policy)
    engine = _mover(proxy).transfer_engine
    engine.complete_after_polls = 2  # batches stay in flight for a few polls

    def fail_some(step: int) -> None:
        if step % 4 == 1:
            engine.inject_failures(3)

    workload = random_workload(seed=12, count=80, min_len=20, max_len=200, max_tokens=2)
    drive(proxy, workload, concurrency=16, before_step=fail_some)
    reasons = _reasons(proxy)
    assert sum(reasons.values()) == 80
    assert proxy.decode.stats.load_errors
    if policy == "fail":
        assert reasons[FinishReason.ERROR] > 0
        assert reasons[FinishReason.ERROR] + reasons[FinishReason.LENGTH] == 80
    else:
        assert reasons == {FinishReason.LENGTH: 80}  # failed blocks were recomputed
    kind = "failed_read" if read_mode else "failed_write"
    assert _mover(proxy).transfer_stats()[kind] > 0
    assert proxy.decode.transfer_stats()["failed"] > 0
    # The producer freed the blocks of failed transfers as well.
    assert proxy.prefill.finished_sending.total() == len(proxy.prefill_done)
    _assert_end_state(proxy)


@MODES
def test_hung_transfers_time_out_as_load_errors(
    make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=1024, extra=FAST)
    engine = _mover(proxy).transfer_engine
    proxy.submit("warm", PROMPT, 2)
    proxy.run(max_steps=50)
    engine.hang = True
    tid = proxy.submit("hung", [t + 1 for t in PROMPT], 2)
    _step_until(proxy, lambda: any(r.tag.startswith(tid) for r in engine.posted))
    engine.hang = False  # later posts complete; the hung ones never do
    proxy.run(max_steps=2000, pause=0.002)
    assert proxy.done["warm"].finish_reason == FinishReason.LENGTH
    assert proxy.done["hung"].finish_reason == FinishReason.ERROR
    assert _mover(proxy).transfer_stats()["failed"] >= 1
    _assert_end_state(proxy)


# -- ordering and lost messages -------------------------------------------------------------


def test_release_before_the_hold_is_buffered_and_applied_once(
    make_pd: Callable[..., PDProxy],
) -> None:
    proxy = make_pd(True, num_blocks=512)
    prefill = proxy.prefill
    producer = prefill.service.producer
    assert producer is not None
    tid = proxy.submit("a", PROMPT, 2)
    _prefill_until_done(proxy, "a")
    # P's worker has not seen the hold order yet; D reads and releases first.
    proxy.step_decode()
    assert any(
        isinstance(s.message, Release) and s.message.transfer_id == tid
        for s in proxy.decode.channel.sent
    )
    assert producer.num_live == 0
    prefill.service.pump()  # the release reaches P's worker before its mapping
    assert producer.pending_buffers["buffered_releases"] == 1
    assert not prefill.finished_sending
    prefill.step()  # the hold arrives and applies the buffered release
    assert prefill.finished_sending == Counter({"p-a": 1})
    assert producer.pending_buffers["buffered_releases"] == 0
    proxy.run(max_steps=50)
    assert prefill.finished_sending == Counter({"p-a": 1})
    assert prefill.transfer_stats()["expired_leases"] == 0
    _assert_end_state(proxy)


def test_write_done_before_the_hold_frees_exactly_once(make_pd: Callable[..., PDProxy]) -> None:
    proxy = make_pd(False, num_blocks=512)
    prefill = proxy.prefill
    proxy.submit("a", PROMPT, 2)
    proxy.step_decode()  # D announces its blocks
    _prefill_until_done(proxy, "a")  # the write ends in the step whose request finishes
    assert not prefill.finished_sending
    prefill.step()  # the hold arrives after the write ended
    assert prefill.finished_sending == Counter({"p-a": 1})
    proxy.run(max_steps=50)
    assert prefill.finished_sending == Counter({"p-a": 1})
    assert proxy.done["a"].finish_reason == FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks > 0
    _assert_end_state(proxy)


def test_lost_release_is_reclaimed_after_the_lease_and_counted(
    make_chaos_pd: Callable[..., PDProxy],
) -> None:
    proxy = make_chaos_pd(True, num_blocks=512, extra=FAST)
    proxy.submit("warm", PROMPT, 2)  # handshakes, so the next send is the release
    proxy.run(max_steps=50)
    proxy.submit("a", [t + 1 for t in PROMPT], 2)
    _prefill_until_done(proxy, "a")
    chaos(proxy.decode).drop_next(1, Release)
    proxy.step_decode()
    assert chaos(proxy.decode).injected[ChannelFault.DROPPED] == 1
    proxy.run(max_steps=2000, pause=0.002)
    assert proxy.done["a"].finish_reason == FinishReason.LENGTH
    assert proxy.decode.stats.verified_blocks > 0
    # The scheduler reclaimed the blocks itself; the worker never reports them again.
    assert "p-a" not in proxy.prefill.finished_sending
    assert proxy.prefill.transfer_stats()["expired_leases"] == 1
    _assert_end_state(proxy)


def test_lost_remote_blocks_fail_the_write_after_the_defer_timeout(
    make_chaos_pd: Callable[..., PDProxy],
) -> None:
    """The producer's verdict cannot carry the capability of an announcement it never got:
    the consumer keeps its blocks fenced until its deadline."""
    proxy = make_chaos_pd(False, num_blocks=512, extra={**FAST, "quarantine_timeout": 0.2})
    chaos(proxy.decode).drop_next(1, RemoteBlocks)  # D's announcement of its blocks
    proxy.submit("a", PROMPT, 2)
    proxy.run(max_steps=2000, pause=0.002)
    assert chaos(proxy.decode).injected[ChannelFault.DROPPED] == 1
    assert proxy.done["a"].finish_reason == FinishReason.ERROR
    assert proxy.prefill.transfer_stats()["failed_write"] == 1
    assert proxy.decode.transfer_stats()["failed_expired"] == 1
    assert proxy.decode.transfer_stats()["verdicts_refused"] == 1
    assert proxy.prefill.finished_sending["p-a"] == 1
    _assert_end_state(proxy)


def test_lost_write_done_expires_the_load(make_chaos_pd: Callable[..., PDProxy]) -> None:
    proxy = make_chaos_pd(False, num_blocks=512, extra=FAST)
    proxy.submit("warm", PROMPT, 2)  # P handshakes with D, so its next send is write_done
    proxy.run(max_steps=50)
    proxy.submit("a", [t + 1 for t in PROMPT], 2)
    proxy.step_decode()
    chaos(proxy.prefill).drop_next(1, WriteDone)
    proxy.run(max_steps=2000, pause=0.002)
    assert chaos(proxy.prefill).injected[ChannelFault.DROPPED] == 1
    assert proxy.done["a"].finish_reason == FinishReason.ERROR
    assert proxy.decode.transfer_stats()["failed_expired"] == 1
    assert proxy.prefill.finished_sending["p-a"] == 1
    _assert_end_state(proxy)


@MODES
def test_duplicated_reordered_and_delayed_messages_release_once(
    make_chaos_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_chaos_pd(read_mode, num_blocks=2048)
    plan = ChannelFaultPlan(duplicate=0.3, reorder=0.3, delay=0.3, delay_max=0.004)
    chaos(proxy.prefill).plan = plan
    chaos(proxy.decode).plan = plan
    drive(proxy, random_workload(seed=13, count=100, max_len=200), concurrency=32)
    assert _reasons(proxy) == {FinishReason.LENGTH: 100}
    assert proxy.decode.stats.verified_blocks > 0
    assert not proxy.decode.stats.load_errors
    for engine in (proxy.prefill, proxy.decode):
        assert max(engine.finished_sending.values(), default=1) == 1
        assert max(engine.finished_recving.values(), default=1) == 1
    if not read_mode:  # duplicate write_done / remote_blocks are ignored and counted
        ignored = proxy.prefill.transfer_stats().get("messages_ignored", 0)
        ignored += proxy.decode.transfer_stats().get("messages_ignored", 0)
        assert ignored > 0
    _assert_end_state(proxy)


# -- aborts ---------------------------------------------------------------------------------


def test_decode_aborted_before_its_load_releases_the_producer(
    make_pd: Callable[..., PDProxy],
) -> None:
    proxy = make_pd(True, num_blocks=512)  # default 60 s lease: only the release frees P
    proxy.submit("warm", PROMPT, 2)
    proxy.run(max_steps=50)
    proxy.submit("a", [t + 1 for t in PROMPT], 2)
    _prefill_until_done(proxy, "a")
    proxy.abort_decode("a")
    proxy.run(max_steps=50)
    assert "a" not in proxy.done
    assert proxy.prefill.finished_sending["p-a"] == 1
    assert proxy.prefill.transfer_stats()["expired_leases"] == 0
    _assert_end_state(proxy)


@MODES
def test_decode_aborted_while_decoding_frees_everything(
    make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=512)
    proxy.submit("a", PROMPT, 100)
    d_id = proxy.decode_ids["a"]
    _step_until(
        proxy,
        lambda: (
            d_id in proxy.decode.scheduler.requests
            and proxy.decode.scheduler.requests[d_id].num_output_tokens >= 3
        ),
    )
    proxy.abort_decode("a")
    proxy.run(max_steps=50)
    assert proxy.decode.stats.verified_blocks > 0
    assert proxy.prefill.finished_sending["p-a"] == 1
    _assert_end_state(proxy)


@pytest.mark.parametrize("point", ["before_prefill", "mid_prefill", "after_write"])
def test_decode_aborted_while_waiting_for_remote_kv(
    make_pd: Callable[..., PDProxy], point: str
) -> None:
    """WRITE: the producer is told, stops or finishes its write, and both sides free all."""
    proxy = make_pd(False, num_blocks=512, max_num_batched_tokens=64)  # chunked prefill
    prompt = list(range(1, 200))
    proxy.submit("a", prompt, 4)
    proxy.step_decode()  # D announces its blocks and waits for the write
    if point == "mid_prefill":
        proxy.step_prefill()
        assert "a" not in proxy.prefill_done
    elif point == "after_write":
        _prefill_until_done(proxy, "a")
    proxy.abort_decode("a")
    proxy.run(max_steps=100)  # default timeouts: nothing waits for a deadline
    assert "a" not in proxy.done
    assert proxy.decode.finished_recving[proxy.decode_ids["a"]] == 1
    assert proxy.prefill.finished_sending == Counter({"p-a": 1})
    if point != "after_write":
        assert proxy.prefill.transfer_stats().get("failed_write", 0) == 1
    _assert_end_state(proxy)


@MODES
def test_random_decode_aborts_leave_nothing_behind(
    make_pd: Callable[..., PDProxy], read_mode: bool
) -> None:
    proxy = make_pd(read_mode, num_blocks=2048, max_num_batched_tokens=256)
    rng = random.Random(14)

    def abort_some(step: int) -> None:
        live = [
            key
            for key, rid in proxy.decode_ids.items()
            if rid in proxy.decode.scheduler.requests and key not in proxy.abandoned
        ]
        for key in live:
            if rng.random() < 0.03:
                proxy.abort_decode(key)
                aborted.add(key)

    aborted: set[str] = set()
    workload = random_workload(seed=15, count=120, max_len=250, max_tokens=8)
    drive(proxy, workload, concurrency=32, before_step=abort_some)
    assert len(aborted) >= 5
    assert aborted.isdisjoint(proxy.done)  # an aborted request has no output
    assert _reasons(proxy) == {FinishReason.LENGTH: 120 - len(aborted)}
    assert proxy.decode.stats.verified_blocks > 0
    if not read_mode:  # writes into aborted requests' blocks were stopped
        assert proxy.prefill.transfer_stats()["failed_write"] > 0
    _assert_end_state(proxy)


# -- the producer never sends ---------------------------------------------------------------


def test_producer_that_never_runs_the_request_expires_the_decode(
    make_pd: Callable[..., PDProxy],
) -> None:
    """WRITE: the load fails at its deadline; the decode request is not stranded."""
    proxy = make_pd(False, num_blocks=512, extra=FAST)
    proxy.submit("a", PROMPT, 2, to_prefill=False)
    proxy.run(max_steps=2000, pause=0.002)
    assert proxy.done["a"].finish_reason == FinishReason.ERROR
    assert proxy.decode.transfer_stats()["failed_expired"] == 1
    _assert_end_state(proxy)


def test_aborted_producer_fails_the_decode_without_waiting(
    make_pd: Callable[..., PDProxy],
) -> None:
    """WRITE: the producer tells the consumer at once (default timeouts, bounded steps)."""
    proxy = make_pd(False, num_blocks=512)
    proxy.submit("a", PROMPT, 2)
    proxy.abort_prefill("a")
    proxy.run(max_steps=50)
    assert proxy.done["a"].finish_reason == FinishReason.ERROR
    assert proxy.decode.transfer_stats()["failed_write"] == 1
    assert not proxy.prefill.finished_sending
    _assert_end_state(proxy)


def test_aborted_producer_in_read_mode_sends_nothing_to_decode(
    make_pd: Callable[..., PDProxy],
) -> None:
    proxy = make_pd(True, num_blocks=512)
    proxy.submit("a", PROMPT, 2)
    proxy.abort_prefill("a")
    proxy.run(max_steps=50)
    assert "a" in proxy.abandoned
    assert not proxy.done
    assert proxy.decode.stats.steps == proxy.prefill.stats.steps
    assert not proxy.prefill.finished_sending
    _assert_end_state(proxy)


# -- leases and unreachable peers -----------------------------------------------------------


def test_read_after_the_lease_is_refused_as_a_load_error(
    make_pd: Callable[..., PDProxy],
) -> None:
    """The producer may reuse its blocks once its lease ends: a late read must not start."""
    proxy = make_pd(True, num_blocks=512, extra=FAST)
    proxy.submit("a", PROMPT, 2)
    _prefill_until_done(proxy, "a")
    lease_ends = proxy.prefill_done["a"].kv_transfer_params["lease_expires_at"]
    while time.time() + FAST["transfer_timeout"] <= lease_ends:
        time.sleep(0.05)  # the decode is slow to start: its read could outlive the lease
    proxy.run(max_steps=2000, pause=0.002)
    assert proxy.done["a"].finish_reason == FinishReason.ERROR
    stats = proxy.decode.transfer_stats()
    assert stats["lease_refusals"] == 1
    assert stats["failed_lease_expired"] == 1
    assert not proxy.decode.transfer_engine.posted  # nothing was read
    _assert_end_state(proxy)


def test_unreachable_producer_fails_the_load(make_pd: Callable[..., PDProxy]) -> None:
    proxy = make_pd(True, num_blocks=512, extra={"handshake_timeout": 0.05})
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": "tx-nobody",
        "remote_block_ids": [[1, 2, 3, 4, 5]],
        "remote_host": "127.0.0.1",
        "remote_handshake_port": 9,  # nothing listens there
        "remote_notify_port": 10,
        "remote_tp_size": 1,
    }
    params = signed_params(params, secrets.token_bytes(32), "nobody#0")
    proxy.decode.add("d-x", PROMPT, 2, params)
    proxy.run(max_steps=20)
    assert proxy.decode.outputs["d-x"].finish_reason == FinishReason.ERROR
    stats = proxy.decode.transfer_stats()
    assert stats["handshake_failures"] == 1
    assert stats["failed_handshake"] == 1
    # Never verified (no handshake): nothing is released on the request's behalf.
    assert not proxy.decode.channel.dropped_sends
    _assert_end_state(proxy)
