"""Property: for any interleaving of schedule/complete/ACK/failure/timeout events, every
transfer is released exactly once and nothing stays pending past its deadline."""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from moriio.domain.ledgers import (
    AckResult,
    Outcome,
    ReadLedger,
    ReleaseLedger,
    TransferResult,
    WriteLedger,
)

TIDS = st.sampled_from([f"t{i}" for i in range(6)])
LAYERS = st.sampled_from(["l0", "l1", "l2"])
TTL = st.floats(min_value=0.5, max_value=5.0)
STEP = st.floats(min_value=0.0, max_value=3.0)
SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)


class ProducerReadRelease(RuleBasedStateMachine):
    """READ producer: blocks held until consumer ranks release them (fan-in), or expiry."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ReleaseLedger(producer_tp=2, max_buffered_acks=8, buffered_ack_ttl=4.0)
        self.now = 0.0
        self.tracked: set[str] = set()
        self.released: Counter[str] = Counter()

    def _collect(self, results: list[TransferResult]) -> None:
        for r in results:
            assert r.request_id == f"req-{r.transfer_id}"
            self.released[r.transfer_id] += 1

    @rule(tid=TIDS, ttl=TTL)
    def track(self, tid: str, ttl: float) -> None:
        self.ledger.track(tid, f"req-{tid}", deadline=self.now + ttl, now=self.now)
        self.tracked.add(tid)

    @rule(tid=TIDS, consumer_tp=st.sampled_from([1, 2, 4, 8]))
    def ack(self, tid: str, consumer_tp: int) -> None:
        result = self.ledger.ack(tid, now=self.now, consumer_tp_size=consumer_tp)
        if tid not in self.tracked:
            assert result is AckResult.BUFFERED

    @rule(tid=TIDS)
    def fail(self, tid: str) -> None:
        self.ledger.fail(tid, "consumer failed", now=self.now)

    @rule(dt=STEP)
    def advance_and_expire(self, dt: float) -> None:
        self.now += dt
        for r in self.ledger.expire(self.now):
            assert r.outcome is Outcome.EXPIRED
        for tid in self.tracked:
            deadline = self.ledger.deadline(tid)
            assert deadline is None or deadline > self.now

    @rule()
    def report(self) -> None:
        self._collect(self.ledger.pop_released())

    @invariant()
    def released_at_most_once(self) -> None:
        assert all(n == 1 for n in self.released.values())
        assert set(self.released) <= self.tracked

    def teardown(self) -> None:
        self.now += 100.0
        self.ledger.expire(self.now)
        self._collect(self.ledger.pop_released())
        assert self.released == Counter(dict.fromkeys(self.tracked, 1))
        assert self.ledger.stats.live == 0
        assert self.ledger.stats.buffered_events == 0
        assert self.ledger.request_id("t0") is None


class ProducerWrite(RuleBasedStateMachine):
    """WRITE producer: per-layer writes feed the release ledger, which also takes aborts."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = WriteLedger()
        self.releases = ReleaseLedger()
        self.now = 0.0
        self.tracked: set[str] = set()
        self.finalized: Counter[str] = Counter()
        self.released: Counter[str] = Counter()

    def _on_write_results(self, results: list[TransferResult]) -> None:
        for r in results:
            self.finalized[r.transfer_id] += 1
            if r.ok:
                self.releases.ack(r.transfer_id, now=self.now)
            else:
                self.releases.fail(r.transfer_id, r.message, now=self.now)

    @rule(tid=TIDS, layer=LAYERS, ttl=TTL)
    def schedule(self, tid: str, layer: str, ttl: float) -> None:
        deadline = self.now + ttl
        if tid not in self.tracked:
            self.releases.track(tid, f"req-{tid}", deadline=deadline, now=self.now)
            self.tracked.add(tid)
        self.writes.schedule(tid, layer, deadline=deadline)

    @rule(tid=TIDS)
    def seal(self, tid: str) -> None:
        result = self.writes.seal(tid)
        self._on_write_results([] if result is None else [result])

    @rule(tid=TIDS, layer=LAYERS, ok=st.booleans())
    def complete(self, tid: str, layer: str, ok: bool) -> None:
        result = self.writes.complete(tid, layer, succeeded=ok, message="x")
        self._on_write_results([] if result is None else [result])

    @rule(tid=TIDS)
    def consumer_abort(self, tid: str) -> None:
        if self.releases.ack(tid, now=self.now) is AckResult.RELEASED:
            result = self.writes.fail(tid, "released by consumer")
            self._on_write_results([] if result is None else [result])

    @rule(dt=STEP)
    def advance_and_expire(self, dt: float) -> None:
        self.now += dt
        self._on_write_results(self.writes.expire(self.now))
        self.releases.expire(self.now)
        for ledger in (self.writes, self.releases):
            for tid in self.tracked:
                deadline = ledger.deadline(tid)
                assert deadline is None or deadline > self.now

    @rule()
    def report(self) -> None:
        for r in self.releases.pop_released():
            self.released[r.transfer_id] += 1

    @invariant()
    def finalized_and_released_at_most_once(self) -> None:
        assert all(n == 1 for n in self.finalized.values())
        assert all(n == 1 for n in self.released.values())

    def teardown(self) -> None:
        self.advance_and_expire(100.0)
        self.report()
        assert self.released == Counter(dict.fromkeys(self.tracked, 1))
        assert self.writes.stats.live == 0


class ConsumerRead(RuleBasedStateMachine):
    """READ consumer: per-layer reads end in exactly one terminal record per transfer."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ReadLedger()
        self.now = 0.0
        self.started: set[str] = set()
        self.finished: Counter[str] = Counter()

    def _collect(self, results: list[TransferResult]) -> None:
        for r in results:
            self.finished[r.transfer_id] += 1

    @rule(tid=TIDS, layers=st.lists(LAYERS, max_size=3), ttl=TTL)
    def start(self, tid: str, layers: list[str], ttl: float) -> None:
        if self.ledger.knows(tid):
            return
        result = self.ledger.start(tid, f"req-{tid}", layers, deadline=self.now + ttl)
        self.started.add(tid)
        self._collect([] if result is None else [result])

    @rule(tid=TIDS, layer=LAYERS, ok=st.booleans())
    def complete(self, tid: str, layer: str, ok: bool) -> None:
        result = self.ledger.complete(tid, layer, succeeded=ok)
        self._collect([] if result is None else [result])

    @rule(dt=STEP)
    def advance_and_expire(self, dt: float) -> None:
        self.now += dt
        self._collect(self.ledger.expire(self.now))
        for tid in self.started:
            deadline = self.ledger.deadline(tid)
            assert deadline is None or deadline > self.now
            if self.ledger.is_live(tid):
                assert self.ledger.pending_layers(tid)

    @invariant()
    def finished_at_most_once(self) -> None:
        assert all(n == 1 for n in self.finished.values())

    def teardown(self) -> None:
        self.advance_and_expire(100.0)
        assert self.finished == Counter(dict.fromkeys(self.started, 1))
        assert self.ledger.stats.pending_layer_reads == 0


TestProducerReadRelease = ProducerReadRelease.TestCase
TestProducerReadRelease.settings = SETTINGS
TestProducerWrite = ProducerWrite.TestCase
TestProducerWrite.settings = SETTINGS
TestConsumerRead = ConsumerRead.TestCase
TestConsumerRead.settings = SETTINGS
