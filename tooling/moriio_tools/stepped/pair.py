"""moriio against vLLM's NixlConnector with both engines stepped as vLLM's engine core steps.

Each connector gets a fresh 1P1D pair of engine processes (:mod:`moriio_tools.engines`, each
stepped the way vLLM's own engine core loop steps it, whatever its connector; the served
deployments' engine settings; cores and OpenMP threads by a
:class:`~moriio_tools.stepped.bindings.Binding`) and one plain engine gives the reference
outputs. This process routes as the routers do:

* ``moriio-read``: prefill with ``max_tokens`` 1, then the decode with what it returned;
* ``moriio-write``: both legs at once;
* ``nixl-progress-off``: the NIXL toy proxy's flow, NIXL's progress thread off.

Every case keeps ``concurrency`` requests in flight (a new one as soon as one ends). Rounds
rotate the connectors' order, so drift on a shared host hits each alike. Per run: requests/s
over the case's wall time (only answers equal to the reference count), TTFT p50 (submission
to the decode's first token, as the engine saw it) and the answers equal to the reference.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

from moriio.domain.params.outgoing_params import decode_leg_params, prefill_leg_params
from moriio.domain.params.request_ids import (
    request_id_with_addresses,
    transfer_id_from_request_id,
)
from moriio.domain.values.addresses import ControlAddress
from moriio_tools.engines.engine_process import EngineProcess, stop_all
from moriio_tools.engines.protocol import (
    IN_PROCESS_ENV,
    EngineSnapshot,
    EngineSpec,
    Finished,
    FirstToken,
    Ready,
    Submit,
)
from moriio_tools.prompts import Prompt
from moriio_tools.serve.deployment import EngineSlot, kv_transfer_config
from moriio_tools.serve.e2e_report import Run
from moriio_tools.serve.nixl_deployment import nixl_engine_env, nixl_transfer_config
from moriio_tools.serve.nixl_proxy import nixl_prefill_body
from moriio_tools.serve.nixl_shim import write_nixl_shim
from moriio_tools.serve.processes import ENGINE_SETTINGS, HOST, free_ports
from moriio_tools.stepped.bindings import BINDINGS, Binding

STEPPED_CONNECTORS = ("moriio-read", "moriio-write", "nixl-progress-off")


@dataclass(frozen=True, slots=True)
class SteppedCase:
    name: str
    prompts: tuple[Prompt, ...]
    concurrency: int


@dataclass(slots=True)
class SteppedRun(Run):
    """One case on one pair; ``loaded``: its decode requests whose prompt KV the connector
    loaded (no CPU time or ITL is measured here). Each request's TTFT splits in two:
    ``prefill_s`` from its submission until the prefill engine finished it (queueing and
    compute), ``handoff_s`` from then until the decode's first token (the KV's way over,
    the decode's scheduling of it and its first step)."""

    loaded: int = 0
    prefill_s: list[float] = field(default_factory=list)
    handoff_s: list[float] = field(default_factory=list)
    binding: str = ""  # the configuration of cores and threads (stepped.bindings)
    # per engine role: cores busy, run-queue waits, wake-ups and preemptions per second
    usage: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ttft_p50_ms(self) -> float | None:
        return _p50_ms(self.ttft_s)

    @property
    def prefill_p50_ms(self) -> float | None:
        return _p50_ms(self.prefill_s)

    @property
    def handoff_p50_ms(self) -> float | None:
        return _p50_ms(self.handoff_s)


def _p50_ms(values: list[float]) -> float | None:
    return 1000 * statistics.median(values) if values else None


def stepped_engine(
    name: str,
    model: Path,
    log_dir: Path,
    kv_config: dict[str, Any] | None,
    *,
    cores: str,
    env: dict[str, str] | None = None,
    first_tokens: bool = True,
) -> EngineProcess:
    """One engine process (not started) stepped as vLLM's engine core steps it, on
    ``cores`` (a ``VLLM_CPU_OMP_THREADS_BIND`` value; ``nobind``: unpinned), with the served
    deployments' engine settings (``vllm serve``'s batch of 2,048 tokens and its stats) and
    their 1 GiB of KV; ``first_tokens``: report each request's first token."""
    return EngineProcess(
        EngineSpec(
            name=name,
            kv_transfer_config=kv_config,
            log_path=str(log_dir / f"{name}.log"),
            model_dir=str(model),
            env={**IN_PROCESS_ENV, **(env or {})},
            cores=parse_cores(cores),
            block_size=int(ENGINE_SETTINGS["block_size"]),
            max_model_len=int(ENGINE_SETTINGS["max_model_len"]),
            max_num_seqs=int(ENGINE_SETTINGS["max_num_seqs"]),
            log_stats=True,
            stepping="engine-core",
            report_first_tokens=first_tokens,
        )
    )


def parse_cores(bind: str) -> tuple[int, ...]:
    """The cores a ``VLLM_CPU_OMP_THREADS_BIND`` value names (``0,1``, ``0-3``; ``nobind``
    and ``all``: none)."""
    if bind in ("nobind", "all", ""):
        return ()
    cores: list[int] = []
    for part in bind.split(","):
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return tuple(cores)


@dataclass(frozen=True, slots=True)
class Routes:
    """How a router drives one connector's pair: ``mode`` read, write or nixl; ``controls``
    the prefill's and the decode's control addresses (moriio)."""

    mode: str
    controls: tuple[ControlAddress, ControlAddress]

    def first_legs(self) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
        """A new request's id, its prefill's params and, in WRITE, its decode's."""
        if self.mode == "nixl":
            return uuid.uuid4().hex, nixl_prefill_body({})["kv_transfer_params"], None
        transfer_id = uuid.uuid4().hex
        prefill, decode = self.controls
        rid = request_id_with_addresses(prefill, decode, transfer_id)
        params = prefill_leg_params(transfer_id, decode, dp_size=1, dp_rank=0, tp_size=1)
        return rid, params, self.decode_params(rid, None) if self.mode == "write" else None

    def decode_params(self, rid: str, returned: dict[str, Any] | None) -> dict[str, Any]:
        """The decode leg's params once the prefill ``returned`` its own (None: WRITE)."""
        if self.mode == "nixl":
            return dict(returned or {})
        transfer_id = transfer_id_from_request_id(rid) or ""
        return decode_leg_params(
            transfer_id, returned, self.controls[0], dp_size=1, dp_rank=0, tp_size=1
        )


class SteppedPair:
    """The prefill and decode engines of one connector, bound by ``binding``, and how it
    routes."""

    def __init__(
        self,
        connector: str,
        model: Path,
        log_dir: Path,
        start_timeout_s: float,
        binding: Binding = BINDINGS["own-cores"],
    ) -> None:
        if connector not in STEPPED_CONNECTORS:
            raise ValueError(f"connector must be one of {', '.join(STEPPED_CONNECTORS)}")
        self.connector = connector
        mode = connector.rsplit("-", 1)[1] if connector.startswith("moriio") else "nixl"
        ports = free_ports(4)
        controls = (
            ControlAddress(HOST, ports[0], ports[1]),
            ControlAddress(HOST, ports[2], ports[3]),
        )
        self.routes = Routes(mode, controls)
        if mode == "nixl":
            shim = write_nixl_shim(log_dir / "nixl-shim")
            configs = [nixl_transfer_config()] * 2
            envs = [nixl_engine_env(shim, ports[0], False), nixl_engine_env(shim, ports[2], False)]
        else:
            slots = (
                EngineSlot("prefill", 0, 0, ports[0], ports[1]),
                EngineSlot("decode", 0, 0, ports[2], ports[3]),
            )
            configs = [kv_transfer_config(slot, mode, None) for slot in slots]
            envs = [{}, {}]
        binds = binding.engines(2)
        self.prefill, self.decode = (
            stepped_engine(
                f"{connector}-{role}",
                model,
                log_dir,
                config,
                cores=bind.cores,
                env={**bind.env, **env},
                first_tokens=role == "decode",
            )
            for role, config, env, bind in zip(
                ("prefill", "decode"), configs, envs, binds, strict=True
            )
        )
        try:
            deadline = time.monotonic() + start_timeout_s
            for engine in (self.prefill, self.decode):
                engine.launch()
            for engine in (self.prefill, self.decode):
                engine.wait_ready(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        stop_all([self.prefill, self.decode])


class EngineLink(Protocol):
    """What :func:`run_case` needs of an engine (an
    :class:`~moriio_tools.engines.engine_process.EngineProcess`)."""

    @property
    def name(self) -> str: ...

    @property
    def connection(self) -> Connection: ...

    @property
    def ready(self) -> Ready | None: ...

    def submit(self, requests: Sequence[Submit]) -> None: ...

    def pump(self) -> None: ...

    def take_finished(self) -> list[Finished]: ...

    def take_first_tokens(self) -> list[FirstToken]: ...

    def snapshot(self, settle_timeout_s: float = 10.0) -> EngineSnapshot: ...


class PairLink(Protocol):
    """What :func:`run_case` needs of a pair (:class:`SteppedPair`)."""

    @property
    def connector(self) -> str: ...

    @property
    def routes(self) -> Routes: ...

    @property
    def prefill(self) -> EngineLink: ...

    @property
    def decode(self) -> EngineLink: ...


def run_case(
    pair: PairLink,
    case: SteppedCase,
    max_tokens: int,
    reference: Sequence[tuple[int, ...]] | None,
    round_index: int,
    idle_timeout_s: float,
) -> tuple[SteppedRun, list[tuple[int, ...] | None]]:
    """``case`` through ``pair``, ``case.concurrency`` requests in flight. With no message
    from either engine for ``idle_timeout_s`` the case ends; what did not answer failed."""
    routes, prefill, decode = pair.routes, pair.prefill, pair.decode
    queue = list(enumerate(case.prompts))
    index_of: dict[str, int] = {}
    submitted: dict[str, float] = {}
    first: dict[str, float] = {}
    prefilled: dict[str, float] = {}  # when the prefill engine finished the request
    answers: list[tuple[int, ...] | None] = [None] * len(case.prompts)
    live: set[str] = set()

    def fill() -> None:
        while queue and len(live) < case.concurrency:
            index, prompt = queue.pop(0)
            rid, params, decode_params = routes.first_legs()
            index_of[rid], submitted[rid] = index, time.time()
            live.add(rid)
            prefill.submit([Submit(rid, tuple(prompt), 1, params)])
            if decode_params is not None:
                decode.submit([Submit(rid, tuple(prompt), max_tokens, decode_params)])

    before = decode.snapshot(settle_timeout_s=0.0)
    started = ended = time.time()
    fill()
    while live:
        if not wait([prefill.connection, decode.connection], timeout=idle_timeout_s):
            break
        prefill.pump()
        decode.pump()
        for done in prefill.take_finished():
            if done.key not in live:
                continue
            prefilled[done.key] = done.wall_time
            if routes.mode == "write":
                continue
            if done.kv_transfer_params is None:  # nothing to decode from: the request failed
                live.discard(done.key)
                continue
            prompt = tuple(case.prompts[index_of[done.key]])
            params = routes.decode_params(done.key, done.kv_transfer_params)
            decode.submit([Submit(done.key, prompt, max_tokens, params)])
        for token in decode.take_first_tokens():
            if token.key in live:
                first[token.key] = token.wall_time
        for done in decode.take_finished():
            if done.key in live:
                answers[index_of[done.key]] = done.token_ids
                ended = max(ended, done.wall_time)
                live.discard(done.key)
        fill()
    wanted = reference if reference is not None else answers
    after = decode.snapshot(settle_timeout_s=0.0)
    run = SteppedRun(
        connector=pair.connector,
        case=case.name,
        round=round_index,
        requests=len(case.prompts),
        equal=sum(1 for a, w in zip(answers, wanted, strict=True) if a is not None and a == w),
        failures=sum(1 for a in answers if a is None),
        wall_s=ended - started,
        cpu_s=None,
        loaded=after.loaded_requests - before.loaded_requests,
        prompt_tokens=sum(len(p) for p in case.prompts),
        prompt_sources={
            k: v - before.prompt_sources.get(k, 0) for k, v in after.prompt_sources.items()
        },
        ttft_s=[first[rid] - submitted[rid] for rid in first],
        prefill_s=[prefilled[rid] - submitted[rid] for rid in first if rid in prefilled],
        handoff_s=[first[rid] - prefilled[rid] for rid in first if rid in prefilled],
    )
    return run, answers
