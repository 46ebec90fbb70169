"""The soak loop: per mode a 1P1D deployment under cycling traffic, kills and quiet checks.

1. The demo model, a fixed pool of prompts and their greedy outputs from one plain engine
   (:func:`moriio_tools.serve.runner.baseline`): every answer is compared with those.
2. Per transfer mode, one after the other (the mode is a connector setting, so each gets a
   deployment of its own and an equal share of the duration): ``moriio router`` and a
   prefill and a decode ``vllm serve`` engine (:class:`~moriio_tools.serve.deployment.
   Deployment`), then until the mode's share is spent, in turn: a burst of requests all in
   flight at once, an idle gap and a trickle, a wave of pool requests amid clients that give
   up mid-stream, an idle gap and a trickle. Every ``kill_every_s`` of the mode's traffic,
   instead, a burst is sent and the prefill or the decode engine (in turn, across modes) is
   SIGKILLed while the decode has requests, then restarted on the same ports and sent pool
   requests.
3. At each interval's end traffic stops until no engine holds a block: the quiet point where
   blocks, requests, RSS and descriptors per engine are recorded.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moriio_tools.prompts import Prompt, build_prompts
from moriio_tools.serve.deployment import Deployment, EngineSlot
from moriio_tools.serve.metrics import Sample, prompt_tokens_by_source, since, total
from moriio_tools.serve.processes import ProcessError
from moriio_tools.serve.runner import ServeDemoConfig, baseline, prepare_model
from moriio_tools.soak.config import QUIET_MIN_S, ROLES, SoakConfig
from moriio_tools.soak.probes import sample_engines, wait_quiet
from moriio_tools.soak.records import Interval, Kill, Slope
from moriio_tools.soak.traffic import Outcome, burst, cancel_wave, pick, trickle
from moriio_tools.soak.verdict import slopes, verdict

Progress = Callable[[str], None]
OnInterval = Callable[[Interval], None]
STEPS = ("burst", "idle", "cancels", "idle")
KILL_WAIT_S = 10.0  # the kill waits this long at most for the decode to have requests
EXAMPLES = 3  # error messages kept per interval


@dataclass(slots=True)
class _Tally:
    """Requests of the interval so far."""

    sent: int = 0
    answered: int = 0
    equal: int = 0
    errors: int = 0
    kill_errors: int = 0
    cancelled: int = 0
    examples: list[str] = field(default_factory=list)

    def add(
        self, outcome: Outcome, expected: Sequence[tuple[int, ...]], *, kill: bool = False
    ) -> int:
        """Count ``outcome``; the number of its answers equal to the reference."""
        equal = 0
        for c in outcome.completions:
            if c.error is not None:
                self.kill_errors += kill
                self.errors += not kill
                if not kill and len(self.examples) < EXAMPLES:
                    self.examples.append(c.error[:120])
            else:
                self.answered += 1
                equal += tuple(c.tokens) == expected[c.index]
        self.sent += len(outcome.completions)
        self.equal += equal
        self.cancelled += outcome.cancelled
        return equal


@dataclass
class SoakResult:
    config: SoakConfig
    intervals: list[Interval]
    kills: list[Kill]
    slopes: list[Slope]
    failures: list[str]
    log_dir: str

    @property
    def ok(self) -> bool:
        return not self.failures

    def totals(self) -> dict[str, int]:
        keys = ("sent", "answered", "equal", "errors", "kill_errors", "cancelled")
        out = {key: sum(getattr(iv, key) for iv in self.intervals) for key in keys}
        return {**out, "intervals": len(self.intervals), "kills": len(self.kills)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failures": self.failures,
            "totals": self.totals(),
            "intervals": [{**asdict(iv), "mismatches": iv.mismatches} for iv in self.intervals],
            "kills": [asdict(k) for k in self.kills],
            "slopes": [asdict(s) for s in self.slopes],
            "config": asdict(self.config),
            "log_dir": self.log_dir,
        }


def _decode_samples(deployment: Deployment) -> list[Sample]:
    return [
        s for slot in deployment.slots if slot.role == "decode" for s in deployment.metrics(slot)
    ]


def _requests_on(deployment: Deployment, slot: EngineSlot) -> float:
    try:
        samples = deployment.metrics(slot)
    except ProcessError:
        return 0.0
    return total(samples, "vllm:num_requests_running") + total(samples, "vllm:num_requests_waiting")


class _Soak:
    def __init__(
        self,
        config: SoakConfig,
        model_dir: Path,
        pool: Sequence[Prompt],
        expected: Sequence[tuple[int, ...]],
        progress: Progress,
        on_interval: OnInterval | None,
    ) -> None:
        self.config = config
        self.model = str(model_dir)
        self.model_dir = model_dir
        self.pool = pool
        self.expected = expected
        self.progress = progress
        self.on_interval = on_interval
        self.rng = random.Random(config.seed)
        seed = config.seed + 1
        length = config.cancel_prompt_len
        self.abandoned = build_prompts(config.cancels, length, seed=seed) if config.cancels else []
        self.intervals: list[Interval] = []
        self.kills: list[Kill] = []
        self.clock_base = 0.0  # soak seconds spent in earlier modes

    def run_mode(self, mode: str, log_dir: Path) -> None:
        config = self.config
        deployment = Deployment(
            self.model_dir,
            mode,
            log_dir,
            engine_args=config.engine_args,
            connector_extra={"defer_timeout": config.defer_timeout_s},
        )
        with deployment:
            deployment.start(self.progress)
            started = time.monotonic()
            base = self.clock_base

            def now() -> float:
                return base + time.monotonic() - started

            end = base + config.mode_s
            every = config.kill_every_s
            next_kill = base + every if every > 0 else float("inf")  # each mode's own schedule
            url = f"{deployment.router_url}/v1/completions"
            lives = {slot.name: (0, base) for slot in deployment.slots}
            tally = _Tally()
            opened = now()
            steps = itertools.cycle(STEPS)
            self.progress(f"{mode}: traffic until {end:.0f} s of the soak clock")
            while now() < end:
                if now() >= next_kill:
                    self._kill(deployment, url, mode, tally, lives, now)
                    while next_kill <= now():  # a kill due while restarting is skipped
                        next_kill += every
                else:
                    self._step(next(steps), url, tally)
                if now() - opened >= config.interval_s or now() >= end:
                    self._close(deployment, mode, tally, lives, now)
                    tally = _Tally()
                    opened = now()
            self.clock_base = now()

    def _step(self, step: str, url: str, tally: _Tally) -> None:
        config, pool = self.config, self.pool
        if step == "burst":
            picks = pick(self.rng, len(pool), config.burst)
            outcome = burst(url, self.model, pool, picks, config.max_tokens)
        elif step == "idle":
            picks = pick(self.rng, len(pool), config.trickle)
            outcome = trickle(url, self.model, pool, picks, config.max_tokens, config.idle_gap_s)
        else:
            picks = pick(self.rng, len(pool), config.normal_with_cancels)
            outcome = cancel_wave(
                url,
                self.model,
                pool,
                picks,
                self.abandoned,
                config.max_tokens,
                config.cancel_max_tokens,
                self.rng,
            )
        tally.add(outcome, self.expected)

    def _kill(
        self,
        deployment: Deployment,
        url: str,
        mode: str,
        tally: _Tally,
        lives: dict[str, tuple[int, float]],
        now: Callable[[], float],
    ) -> None:
        """A burst in flight, a SIGKILL to the next victim, its restart, then pool requests."""
        config, pool = self.config, self.pool
        role = ROLES[len(self.kills) % len(ROLES)]
        victim = next(s for s in deployment.slots if s.role == role)
        decode = next(s for s in deployment.slots if s.role == "decode")
        picks = pick(self.rng, len(pool), config.burst)
        box: list[Outcome] = []

        def send() -> None:
            box.append(burst(url, self.model, pool, picks, config.max_tokens))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        deadline = time.monotonic() + KILL_WAIT_S
        while _requests_on(deployment, decode) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.progress(f"{mode}: SIGKILL {victim.name} with {len(picks)} requests sent")
        at = now()
        deployment.kill(victim)
        sender.join()
        wave = box[0] if box else Outcome()
        tally.add(wave, self.expected, kill=True)
        restarting = time.monotonic()
        deployment.restart(victim)
        restart_s = time.monotonic() - restarting
        lives[victim.name] = (lives[victim.name][0] + 1, now())
        self.progress(f"{mode}: {victim.name} restarted in {restart_s:.1f} s")
        recovery_picks = pick(self.rng, len(pool), config.recovery)
        before = _decode_samples(deployment)
        recovery = burst(url, self.model, pool, recovery_picks, config.max_tokens)
        recovery_sources = prompt_tokens_by_source(since(_decode_samples(deployment), before))
        recovery_equal = tally.add(recovery, self.expected)
        self.kills.append(
            Kill(
                mode=mode,
                engine=victim.name,
                role=role,
                t_s=round(at, 1),
                in_flight=len(picks),
                answered=sum(c.error is None for c in wave.completions),
                errors=sum(c.error is not None for c in wave.completions),
                restart_s=round(restart_s, 1),
                recovery=len(recovery_picks),
                recovery_equal=recovery_equal,
                recovery_prompt_tokens=sum(len(pool[i]) for i in recovery_picks),
                recovery_sources=recovery_sources,
            )
        )

    def _close(
        self,
        deployment: Deployment,
        mode: str,
        tally: _Tally,
        lives: dict[str, tuple[int, float]],
        now: Callable[[], float],
    ) -> None:
        metrics, quiet_s = wait_quiet(deployment, QUIET_MIN_S, self.config.quiet_timeout_s)
        at = now()
        interval = Interval(
            index=len(self.intervals) + 1,
            mode=mode,
            t_s=round(at, 1),
            sent=tally.sent,
            answered=tally.answered,
            equal=tally.equal,
            errors=tally.errors,
            kill_errors=tally.kill_errors,
            cancelled=tally.cancelled,
            quiet_s=quiet_s,
            engines=sample_engines(deployment, metrics, lives, at),
            error_examples=tuple(tally.examples),
        )
        self.intervals.append(interval)
        if self.on_interval is not None:
            self.on_interval(interval)


def run_soak(
    config: SoakConfig,
    progress: Progress,
    on_interval: OnInterval | None = None,
    reference: Mapping[Prompt, tuple[int, ...]] | None = None,
) -> SoakResult:
    """The whole soak (see the module's docstring); ``on_interval`` sees each interval's
    record as it closes. ``reference``: the model's greedy outputs of ``config.max_tokens``
    tokens already known for every prompt of the pool (one plain engine's), which then
    starts no reference engine of its own."""
    config.validate()
    root = Path(config.log_dir) if config.log_dir else Path(tempfile.mkdtemp(prefix="moriio-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    pool = build_prompts(config.pool, seed=config.seed)
    missing = 0 if reference is None else sum(prompt not in reference for prompt in pool)
    if missing:
        raise ValueError(f"the reference lacks {missing} of the pool's {len(pool)} prompts")
    demo = ServeDemoConfig(max_tokens=config.max_tokens, model_cache_dir=config.model_cache_dir)
    progress("preparing the model and tokenizer")
    model_dir = prepare_model(demo)
    if reference is None:
        progress(f"reference: {len(pool)} prompts on one plain vLLM server")
        expected = baseline(model_dir, pool, demo, root)
    else:
        expected = [reference[prompt] for prompt in pool]
    soak = _Soak(config, model_dir, pool, expected, progress, on_interval)
    for mode in config.modes:
        soak.run_mode(mode, root / mode)
    return SoakResult(
        config=config,
        intervals=soak.intervals,
        kills=soak.kills,
        slopes=slopes(soak.intervals),
        failures=verdict(soak.intervals, soak.kills),
        log_dir=str(root),
    )
