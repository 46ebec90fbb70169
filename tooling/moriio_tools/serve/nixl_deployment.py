"""1P1D with vLLM's own NixlConnector behind :mod:`moriio_tools.serve.nixl_proxy`.

Both engines run ``kv_role: kv_both`` with the KV in host memory (``kv_buffer_device: cpu``)
and their own NIXL side-channel port (``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``_PORT``); NIXL is
found through the ``nixl`` shim (:mod:`moriio_tools.serve.nixl_shim`). The connector's
settings are vLLM's defaults; ``progress_thread`` False turns NIXL's progress thread off
through the shim (the one change a comparison on stepped engines needs) and nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio_tools.serve.nixl_proxy import nixl_proxy_process
from moriio_tools.serve.nixl_shim import write_nixl_shim
from moriio_tools.serve.peer_deployment import PeerDeployment, PeerEngine, Progress
from moriio_tools.serve.processes import HOST, ManagedProcess, free_ports


def nixl_transfer_config() -> dict[str, Any]:
    """The ``--kv-transfer-config`` of either engine: vLLM's defaults (UCX, its default
    ``num_threads``), the KV in host memory."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"backends": ["UCX"]},
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
class NixlDeployment(PeerDeployment):
    """The NIXL proxy + one prefill and one decode engine; ``router_url`` once started."""

    progress_thread: bool = True

    def start(self, progress: Progress) -> None:
        proxy_port, *ports = free_ports(5)
        shim = write_nixl_shim(self.log_dir / "nixl-shim")
        config = nixl_transfer_config()
        engines = (
            PeerEngine(
                "prefill", ports[0], config, nixl_engine_env(shim, ports[1], self.progress_thread)
            ),
            PeerEngine(
                "decode", ports[2], config, nixl_engine_env(shim, ports[3], self.progress_thread)
            ),
        )

        def proxy(prefill: str, decode: str) -> ManagedProcess:
            return nixl_proxy_process(
                proxy_port,
                [prefill],
                [decode],
                log_path=self.log_dir / "proxy.log",
                extra_args=self.proxy_args,
            )

        self._launch("nixl", engines, proxy, proxy_port, progress)
