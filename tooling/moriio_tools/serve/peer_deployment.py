"""What the 1P1D deployments of vLLM's own connectors (NIXL, Mooncake) share: two engines
bound one per core, a proxy in front, and what ``moriio bench --e2e`` asks of a deployment."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio_tools.serve.processes import HOST, ManagedProcess, engine_cpu_binds, vllm_server

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PeerEngine:
    """One engine of a peer deployment: its role (``prefill`` / ``decode``), HTTP port,
    ``--kv-transfer-config`` and environment."""

    role: str
    http_port: int
    transfer_config: Mapping[str, Any]
    env: Mapping[str, str]


@dataclass
class PeerDeployment(ABC):
    """Engines plus a proxy; ``router_url`` (the proxy) and ``decode_url`` once started."""

    model_dir: Path
    log_dir: Path
    start_timeout_s: float = 600.0
    engine_args: tuple[str, ...] = ()
    proxy_args: tuple[str, ...] = ()  # extra flags for the proxy (see ``proxy_parser``)
    router_url: str = ""
    decode_url: str = ""
    _engines: list[ManagedProcess] = field(default_factory=list)
    _processes: list[ManagedProcess] = field(default_factory=list)

    @abstractmethod
    def start(self, progress: Progress) -> None:
        """Start every process; returns once all are ready."""

    def _launch(
        self,
        name: str,
        engines: tuple[PeerEngine, PeerEngine],
        proxy: Callable[[str, str], ManagedProcess],
        proxy_port: int,
        progress: Progress,
    ) -> None:
        """Start the prefill and decode ``engines`` (``<name>-<role>``, one core each), then
        ``proxy(prefill_url, decode_url)``; returns once every process is ready."""
        urls: dict[str, str] = {}
        for engine, cpu_bind in zip(engines, engine_cpu_binds(2), strict=True):
            process = vllm_server(
                f"{name}-{engine.role}",
                self.model_dir,
                engine.http_port,
                log_path=self.log_dir / f"{engine.role}.log",
                kv_transfer_config=engine.transfer_config,
                extra_args=self.engine_args,
                extra_env=engine.env,
                cpu_bind=cpu_bind,
            )
            self._processes.append(process)
            self._engines.append(process)
            process.start()
            urls[engine.role] = f"http://{HOST}:{engine.http_port}"
        front = proxy(urls["prefill"], urls["decode"])
        self._processes.append(front)
        front.start()
        progress(f"{name}: starting 1P1D + proxy")
        deadline = time.monotonic() + self.start_timeout_s
        for process in self._processes:
            process.wait_ready(max(1.0, deadline - time.monotonic()))
        self.router_url = f"http://{HOST}:{proxy_port}"
        self.decode_url = urls["decode"]

    def engine_pids(self) -> list[int]:
        return [p.pid for p in self._engines if p.pid is not None]

    def decode_urls(self) -> list[str]:
        return [self.decode_url] if self.decode_url else []

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        self._engines.clear()

    def __enter__(self) -> PeerDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
