"""moriio against vLLM's NixlConnector with both engines stepped without pause.

Each connector gets a fresh 1P1D pair of :mod:`moriio_tools.stepped.engine` processes (one
core each, the served deployments' engine settings) and one plain engine gives the reference
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

import contextlib
import json
import secrets
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any, Protocol

from moriio.domain.params.outgoing_params import decode_leg_params, prefill_leg_params
from moriio.domain.params.request_ids import (
    request_id_with_addresses,
    transfer_id_from_request_id,
)
from moriio.domain.values.addresses import ControlAddress
from moriio_tools.prompts import Prompt
from moriio_tools.serve.deployment import EngineSlot, kv_transfer_config
from moriio_tools.serve.e2e_report import Run
from moriio_tools.serve.nixl_deployment import nixl_engine_env, nixl_transfer_config
from moriio_tools.serve.nixl_proxy import nixl_prefill_body
from moriio_tools.serve.nixl_shim import write_nixl_shim
from moriio_tools.serve.processes import (
    HOST,
    ManagedProcess,
    ProcessError,
    engine_cpu_binds,
    free_ports,
)
from moriio_tools.stepped.engine import CORES_ENV, ENGINE_ENV

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


class SteppedEngine:
    """One engine process and the connection it dialled back on."""

    def __init__(
        self,
        name: str,
        model: Path,
        log_dir: Path,
        kv_config: dict[str, Any] | None,
        env: dict[str, str],
    ) -> None:
        authkey = secrets.token_hex(16)
        listener = Listener((HOST, 0), authkey=authkey.encode())
        host, port = listener.address
        argv = [sys.executable, "-m", "moriio_tools.stepped.engine", "--model", str(model)]
        argv += ["--address", f"{host}:{port}"]
        if kv_config is not None:
            argv += ["--kv-transfer-config", json.dumps(kv_config)]
        self.name = name
        self.process = ManagedProcess(
            name,
            argv,
            log_path=log_dir / f"{name}.log",
            ready_url="",
            env={**ENGINE_ENV, **env, "MORIIO_STEPPED_AUTHKEY": authkey},
        )
        self._listener = listener
        self.process.start()
        self.conn: Connection | None = None

    def connect(self, timeout: float) -> Connection:
        """Wait until the engine is built and dialled back (bounded by ``timeout``)."""
        try:
            conn = _accept(self._listener, self.process, timeout)
        finally:
            self._listener.close()
        if conn.recv() != ("ready",):
            raise ProcessError(f"{self.name}: unexpected first message")
        self.conn = conn
        return conn

    def add(self, rid: str, prompt: Prompt, max_tokens: int, params: dict[str, Any] | None) -> None:
        if self.conn is None:
            raise ProcessError(f"{self.name} is not connected")
        self.conn.send(("add", rid, prompt, max_tokens, params))

    def loaded(self, timeout: float) -> tuple[int, dict[str, int]]:
        """Requests whose prompt KV the connector loaded, and prompt tokens per source
        (loaded, prefix cache, computed), since start."""
        if self.conn is None:
            raise ProcessError(f"{self.name} is not connected")
        self.conn.send(("loaded",))
        deadline = time.monotonic() + timeout
        while self.conn.poll(max(0.0, deadline - time.monotonic())):
            message = self.conn.recv()
            if message[0] == "loaded":
                return int(message[1]), {str(k): int(v) for k, v in message[2].items()}
        raise ProcessError(f"{self.name} did not say what it loaded")

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(("stop",))
            self.conn.close()
            self.conn = None
        self._listener.close()
        self.process.stop()


def _accept(listener: Listener, process: ManagedProcess, timeout: float) -> Connection:
    """The engine's connection, once it dialled back; ProcessError if it exits or takes
    longer than ``timeout`` (closing the listener ends the blocked accept)."""
    accepted: list[Connection] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and process.running() and time.monotonic() < deadline:
        thread.join(0.5)
    if not accepted:
        listener.close()
        raise ProcessError(f"{process.name} did not start; see {process.log_path}")
    return accepted[0]


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
    """The prefill and decode engines of one connector, one core each, and how it routes."""

    def __init__(self, connector: str, model: Path, log_dir: Path, start_timeout_s: float) -> None:
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
        binds = engine_cpu_binds(2)
        self.prefill, self.decode = (
            SteppedEngine(
                f"{connector}-{role}", model, log_dir, config, {**env, **engine_env(bind)}
            )
            for role, config, env, bind in zip(
                ("prefill", "decode"), configs, envs, binds, strict=True
            )
        )
        try:
            deadline = time.monotonic() + start_timeout_s
            for engine in (self.prefill, self.decode):
                engine.connect(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for engine in (self.prefill, self.decode):
            engine.close()


def engine_env(cores: str) -> dict[str, str]:
    """An engine's CPU settings: its cores (``nobind``: none), the served deployments' KV."""
    bound = {} if cores == "nobind" else {CORES_ENV: cores}
    return {**bound, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}


class EngineLink(Protocol):
    """What :func:`run_case` needs of an engine (:class:`SteppedEngine`)."""

    @property
    def name(self) -> str: ...

    @property
    def conn(self) -> Connection | None: ...

    def add(
        self, rid: str, prompt: Prompt, max_tokens: int, params: dict[str, Any] | None
    ) -> None: ...

    def loaded(self, timeout: float) -> tuple[int, dict[str, int]]: ...


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
            prefill.add(rid, prompt, 1, params)
            if decode_params is not None:
                decode.add(rid, prompt, max_tokens, decode_params)

    loaded_before, sources_before = decode.loaded(idle_timeout_s)
    started = ended = time.time()
    fill()
    conns = [c for c in (prefill.conn, decode.conn) if c is not None]
    while live:
        ready = wait(conns, timeout=idle_timeout_s)
        if not ready:
            break
        for conn in (c for c in conns if c in ready):
            kind, rid, *rest = conn.recv()
            if rid not in live:
                continue
            if conn is prefill.conn:
                if kind == "done":
                    prefilled[rid] = rest[2]
                if kind == "done" and routes.mode != "write":
                    returned = rest[1]
                    if isinstance(returned, dict):
                        prompt = case.prompts[index_of[rid]]
                        decode.add(rid, prompt, max_tokens, routes.decode_params(rid, returned))
                    else:  # nothing to decode from: the request failed
                        live.discard(rid)
            elif kind == "first":
                first[rid] = rest[0]
            elif kind == "done":
                answers[index_of[rid]] = tuple(rest[0])
                ended = max(ended, rest[2])
                live.discard(rid)
        fill()
    wanted = reference if reference is not None else answers
    loaded_after, sources_after = decode.loaded(idle_timeout_s)
    run = SteppedRun(
        connector=pair.connector,
        case=case.name,
        round=round_index,
        requests=len(case.prompts),
        equal=sum(1 for a, w in zip(answers, wanted, strict=True) if a is not None and a == w),
        failures=sum(1 for a in answers if a is None),
        wall_s=ended - started,
        cpu_s=None,
        loaded=loaded_after - loaded_before,
        prompt_tokens=sum(len(p) for p in case.prompts),
        prompt_sources={k: v - sources_before.get(k, 0) for k, v in sources_after.items()},
        ttft_s=[first[rid] - submitted[rid] for rid in first],
        prefill_s=[prefilled[rid] - submitted[rid] for rid in first if rid in prefilled],
        handoff_s=[first[rid] - prefilled[rid] for rid in first if rid in prefilled],
    )
    return run, answers
