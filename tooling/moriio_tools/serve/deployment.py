"""A P/D deployment on this machine: ``moriio router`` plus prefill and decode vLLM servers.

The engines are configured exactly as docs/deploying.md tells a user to: the moriio
connector over NIXL, and ``proxy_ip`` / ``proxy_ping_port`` / ``http_port`` so that they
register with the router on their own. Ready means every engine answers ``/health`` and
the router lists every one of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio_tools.serve.metrics import Sample, parse
from moriio_tools.serve.processes import (
    HOST,
    ManagedProcess,
    ProcessError,
    engine_cpu_binds,
    free_ports,
    http_get,
    router_process,
    vllm_router_process,
    vllm_server,
)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class EngineSlot:
    role: str  # "prefill" or "decode"
    index: int
    http_port: int
    handshake_port: int
    notify_port: int

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"


def kv_transfer_config(
    slot: EngineSlot, mode: str, ping_port: int | None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of one engine (docs/deploying.md, CPU + NIXL); with a
    ``ping_port`` it registers with the router listening there."""
    registration: dict[str, Any] = (
        {}
        if ping_port is None
        else {
            "proxy_ip": HOST,
            "proxy_ping_port": ping_port,
            "proxy_ping_interval": 1.0,
            "http_port": slot.http_port,
        }
    )
    return {
        "kv_connector": "MoriioKVConnector",
        "kv_connector_module_path": "moriio.vllm_plugin",
        "kv_role": "kv_producer" if slot.role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": {
            "transport": "nixl",
            "read_mode": mode == "read",
            "host_ip": HOST,
            "handshake_port": slot.handshake_port,
            "notify_port": slot.notify_port,
            **registration,
            **(extra or {}),
        },
    }


@dataclass
class Deployment:
    """Router + ``prefill`` x P + ``decode`` x D servers for one transfer mode."""

    model_dir: Path
    mode: str
    log_dir: Path
    prefill: int = 1
    decode: int = 1
    start_timeout_s: float = 600.0
    connector_extra: dict[str, Any] = field(default_factory=dict)
    engine_args: tuple[str, ...] = ()  # extra `vllm serve` flags for every engine
    router: str = "moriio"  # or "vllm-router"
    prefill_engine_args: tuple[str, ...] = ()  # then these for the prefill engines
    decode_engine_args: tuple[str, ...] = ()  # and these for the decode engines
    env: dict[str, str] = field(default_factory=dict)  # for the router and every engine
    router_args: tuple[str, ...] = ()  # extra `moriio router` flags
    slot_args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by slot name, last
    slot_env: dict[str, dict[str, str]] = field(default_factory=dict)  # by slot name, last
    # Slot names started (and registered with the router) one group after another, so that
    # the router's pools list them in this order; empty: all at once.
    waves: tuple[tuple[str, ...], ...] = ()
    slots: list[EngineSlot] = field(default_factory=list)
    router_url: str = ""
    _processes: list[ManagedProcess] = field(default_factory=list)
    _ping_port: int = 0
    _cpu_binds: dict[str, str] = field(default_factory=dict)

    def start(self, progress: Progress) -> None:
        count = self.prefill + self.decode
        ports = iter(free_ports(3 + 3 * count))
        router_port, ping_port, metrics_port = next(ports), next(ports), next(ports)
        roles = ["prefill"] * self.prefill + ["decode"] * self.decode
        indices = list(range(self.prefill)) + list(range(self.decode))
        self.slots = [
            EngineSlot(role, i, next(ports), next(ports), next(ports))
            for role, i in zip(roles, indices, strict=True)
        ]
        self.router_url = f"http://{HOST}:{router_port}"
        log_path = self.log_dir / "router.log"
        router = (
            vllm_router_process(router_port, ping_port, metrics_port, log_path=log_path)
            if self.router == "vllm-router"
            else router_process(
                router_port, ping_port, log_path=log_path, env=self.env, extra_args=self.router_args
            )
        )
        self._processes.append(router)
        router.start()
        self._ping_port = ping_port
        self._cpu_binds = dict(
            zip((s.name for s in self.slots), engine_cpu_binds(count), strict=True)
        )
        progress(f"{self.mode}: starting {self.prefill}P{self.decode}D + router")
        deadline = time.monotonic() + self.start_timeout_s
        by_name = {slot.name: slot for slot in self.slots}
        for wave in self.waves or (tuple(by_name),):
            engines = [self._start_engine(by_name[name]) for name in wave]
            for engine in engines:
                engine.wait_ready(max(1.0, deadline - time.monotonic()))
            self._wait_registered(deadline, {by_name[name].url for name in wave})

    def _start_engine(self, slot: EngineSlot) -> ManagedProcess:
        config = kv_transfer_config(slot, self.mode, self._ping_port, self.connector_extra)
        engine = vllm_server(
            slot.name,
            self.model_dir,
            slot.http_port,
            log_path=self.log_dir / f"{slot.name}.log",
            kv_transfer_config=config,
            extra_args=self.args_of(slot),
            cpu_bind=self._cpu_binds[slot.name],
            extra_env={**self.env, **self.slot_env.get(slot.name, {})},
        )
        self._processes.append(engine)
        engine.start()
        return engine

    def args_of(self, slot: EngineSlot) -> tuple[str, ...]:
        """The extra ``vllm serve`` flags of ``slot``'s engine: the common ones, then its
        role's (later flags win)."""
        own = self.prefill_engine_args if slot.role == "prefill" else self.decode_engine_args
        return (*self.engine_args, *own, *self.slot_args.get(slot.name, ()))

    def kill(self, slot: EngineSlot) -> None:
        """Crash ``slot``'s engine: SIGKILL to its server and engine processes, no shutdown."""
        for process in [p for p in self._processes if p.name == slot.name]:
            process.kill()
            self._processes.remove(process)

    def restart(self, slot: EngineSlot) -> None:
        """Start a fresh engine for a killed ``slot``, on the same ports; returns once it
        serves and the router lists it."""
        deadline = time.monotonic() + self.start_timeout_s
        self._start_engine(slot).wait_ready(self.start_timeout_s)
        self._wait_registered(deadline, {s.url for s in self.slots})

    def _registered(self) -> set[str]:
        """Engine URLs ``moriio router`` lists on ``/instances``."""
        status, body = http_get(f"{self.router_url}/instances")
        if status != 200:
            return set()
        data = json.loads(body)
        return set(data["prefill"]) | set(data["decode"])

    def _wait_registered(self, deadline: float, want: set[str]) -> None:
        """moriio router: the engines at ``want`` listed. vllm-router lists discovered engines
        nowhere; its /health answers 200 once a prefill and a decode engine registered."""
        seen: set[str] = set()
        while time.monotonic() < deadline:
            if self.router == "vllm-router":
                status, _ = http_get(f"{self.router_url}/health")
                if status == 200:
                    return
            else:
                seen = self._registered()
                if want <= seen:
                    return
            time.sleep(0.5)
        raise ProcessError(
            f"engines not registered with the router: missing {sorted(want - seen)}; "
            f"see {self.log_dir / 'router.log'}"
        )

    def engine_pids(self) -> list[int]:
        """Process ids of the engines' servers (each leads its own session)."""
        names = {s.name for s in self.slots}
        return [p.pid for p in self._processes if p.name in names and p.pid is not None]

    def decode_urls(self) -> list[str]:
        return [s.url for s in self.slots if s.role == "decode"]

    def pid_of(self, slot: EngineSlot) -> int | None:
        """Process id of ``slot``'s live server (it leads the session of its engine's
        processes); None while it is killed."""
        pids = [p.pid for p in self._processes if p.name == slot.name and p.pid is not None]
        return pids[-1] if pids else None

    def metrics(self, slot: EngineSlot) -> list[Sample]:
        status, body = http_get(f"{slot.url}/metrics")
        if status != 200:
            raise ProcessError(f"{slot.name} /metrics answered {status}")
        return parse(body)

    def router_stats(self) -> dict[str, Any]:
        """What the router says of itself (``moriio router`` only: served, failed, ...)."""
        if self.router == "vllm-router":
            return {"router": "vllm-router"}
        status, body = http_get(f"{self.router_url}/instances")
        return {"router": "moriio", **json.loads(body)} if status == 200 else {}

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
