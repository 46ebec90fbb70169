"""1P1D with vLLM's own NixlConnector behind :mod:`moriio.tools.serve.nixl_proxy`.

Both engines run ``kv_role: kv_both`` with the KV in host memory (``kv_buffer_device: cpu``)
and their own NIXL side-channel port (``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``_PORT``); NIXL is
found through the ``nixl`` shim (:mod:`moriio.tools.serve.nixl_shim`). ``progress_thread``
False turns NIXL's progress thread off through the shim and asks vLLM for no UCX worker
threads (``num_threads: 0``); True keeps vLLM's defaults.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio.tools.serve.deployment import Progress
from moriio.tools.serve.nixl_proxy import nixl_proxy_process
from moriio.tools.serve.nixl_shim import write_nixl_shim
from moriio.tools.serve.processes import (
    HOST,
    ManagedProcess,
    engine_cpu_binds,
    free_ports,
    vllm_server,
)


def nixl_transfer_config(progress_thread: bool) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of either engine."""
    extra: dict[str, Any] = {"backends": ["UCX"]}
    if not progress_thread:
        extra["num_threads"] = 0
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": extra,
    }


def nixl_engine_env(
    shim_dir: Path, side_channel_port: int, progress_thread: bool
) -> dict[str, str]:
    """What an engine running NixlConnector needs in its environment."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(shim_dir), path) if p),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": HOST,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
        "MORIIO_NIXL_PROGRESS_THREAD": "1" if progress_thread else "0",
        "UCX_MODULES": os.environ.get("UCX_MODULES", "^ib"),
    }


@dataclass
class NixlDeployment:
    """The NIXL proxy + one prefill and one decode engine; ``router_url`` once started."""

    model_dir: Path
    log_dir: Path
    progress_thread: bool = True
    start_timeout_s: float = 600.0
    engine_args: tuple[str, ...] = ()
    router_url: str = ""
    _engines: list[ManagedProcess] = field(default_factory=list)
    _processes: list[ManagedProcess] = field(default_factory=list)

    def start(self, progress: Progress) -> None:
        proxy_port, *ports = free_ports(5)
        shim = write_nixl_shim(self.log_dir / "nixl-shim")
        urls: dict[str, str] = {}
        for (role, http_port, side_port), cpu_bind in zip(
            (("prefill", ports[0], ports[1]), ("decode", ports[2], ports[3])),
            engine_cpu_binds(2),
            strict=True,
        ):
            engine = vllm_server(
                f"nixl-{role}",
                self.model_dir,
                http_port,
                log_path=self.log_dir / f"{role}.log",
                kv_transfer_config=nixl_transfer_config(self.progress_thread),
                extra_args=self.engine_args,
                extra_env=nixl_engine_env(shim, side_port, self.progress_thread),
                cpu_bind=cpu_bind,
            )
            self._processes.append(engine)
            self._engines.append(engine)
            engine.start()
            urls[role] = f"http://{HOST}:{http_port}"
        proxy = nixl_proxy_process(
            proxy_port, [urls["prefill"]], [urls["decode"]], log_path=self.log_dir / "proxy.log"
        )
        self._processes.append(proxy)
        proxy.start()
        progress("NixlConnector: starting 1P1D + proxy")
        deadline = time.monotonic() + self.start_timeout_s
        for process in self._processes:
            process.wait_ready(max(1.0, deadline - time.monotonic()))
        self.router_url = f"http://{HOST}:{proxy_port}"

    def engine_pids(self) -> list[int]:
        return [p.pid for p in self._engines if p.pid is not None]

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        self._engines.clear()

    def __enter__(self) -> NixlDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
