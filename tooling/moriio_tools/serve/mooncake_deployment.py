"""1P1D with vLLM's own MooncakeConnector behind :mod:`moriio_tools.serve.mooncake_proxy`.

The prefill runs ``kv_role: kv_producer`` and the decode ``kv_consumer``, each with a fixed
``engine_id``; the Mooncake transfer engine moves the KV over TCP (``mooncake_protocol:
tcp``), the prefill pushing it from host memory with a small sender pool (``num_workers``).
The prefill starts the bootstrap server the decode asks where its workers are
(``VLLM_MOONCAKE_BOOTSTRAP_PORT``); both bind to loopback (``VLLM_HOST_IP``), and a decode
gives up on KV that does not come after ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` seconds. The
connector is loaded through :mod:`moriio_tools.serve.mooncake_shim` (CPU-only torch).

The transfer engine is the ``mooncake`` package (``mooncake-transfer-engine-non-cuda``); its
library needs ``libibverbs.so.1`` even for TCP. Where that library is not installed, the
directories named in ``MORIIO_MOONCAKE_LIB_DIR`` (``:``-separated) go first on the engines'
``LD_LIBRARY_PATH``. :func:`mooncake_available` says whether both can be loaded.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio_tools.serve.mooncake_proxy import mooncake_proxy_process
from moriio_tools.serve.mooncake_shim import MODULE, write_mooncake_shim
from moriio_tools.serve.peer_deployment import PeerDeployment, PeerEngine, Progress
from moriio_tools.serve.processes import HOST, ManagedProcess, ProcessError, free_ports

LIB_DIR_ENV = "MORIIO_MOONCAKE_LIB_DIR"
MOONCAKE_PACKAGE = "mooncake"
MOONCAKE_DISTRIBUTION = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
VERBS_LIBRARY = "libibverbs.so.1"
PREFILL_ENGINE_ID = "mc-prefill"
DECODE_ENGINE_ID = "mc-decode"
SENDER_WORKERS = 2  # the prefill's sender threads (vLLM's default, 10, crowds 2 cores)
ABORT_REQUEST_TIMEOUT_S = 60  # vLLM's default: 480


def mooncake_library_env() -> dict[str, str]:
    """The engines' ``LD_LIBRARY_PATH`` with ``MORIIO_MOONCAKE_LIB_DIR`` first (empty when
    that is not set)."""
    extra = os.environ.get(LIB_DIR_ENV, "")
    if not extra:
        return {}
    path = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (extra, path) if p)}


def _load_error(library: str) -> str | None:
    """Why ``ctypes.CDLL(library)`` fails in a fresh interpreter with the engines'
    ``LD_LIBRARY_PATH`` (the loader reads it only at start); None when it loads."""
    check = f"import ctypes; ctypes.CDLL({library!r})"
    env = {**os.environ, **mooncake_library_env()}
    argv = [sys.executable, "-S", "-c", check]
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def mooncake_available() -> str | None:
    """None when MooncakeConnector can run from this interpreter, else why not (one line)."""
    if importlib.util.find_spec(MOONCAKE_PACKAGE) is None:
        return (
            f"the {MOONCAKE_PACKAGE!r} package is not importable in {sys.executable} "
            f"(pip install --no-deps {MOONCAKE_DISTRIBUTION})"
        )
    error = _load_error(VERBS_LIBRARY)
    if error is not None:
        return (
            f"{VERBS_LIBRARY} cannot be loaded ({error}); install libibverbs1 or name its "
            f"directory in {LIB_DIR_ENV}"
        )
    return None


def mooncake_transfer_config(role: str, engine_id: str) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of an engine; ``role``: kv_producer or kv_consumer."""
    return {
        "kv_connector": "MooncakeConnector",
        "kv_connector_module_path": MODULE,
        "kv_role": role,
        "engine_id": engine_id,
        "kv_connector_extra_config": {
            "mooncake_protocol": "tcp",
            "device_name": "",
            "num_workers": SENDER_WORKERS,
        },
    }


def mooncake_engine_env(shim_dir: Path, bootstrap_port: int | None) -> dict[str, str]:
    """What an engine running MooncakeConnector needs in its environment;
    ``bootstrap_port``: where the prefill serves its bootstrap server (None: the decode)."""
    path = os.environ.get("PYTHONPATH", "")
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(shim_dir), path) if p),
        "VLLM_HOST_IP": HOST,
        "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": str(ABORT_REQUEST_TIMEOUT_S),
        **mooncake_library_env(),
    }
    if bootstrap_port is not None:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
    return env


@dataclass
class MooncakeDeployment(PeerDeployment):
    """The Mooncake proxy + one prefill and one decode engine; ``router_url`` once started."""

    def start(self, progress: Progress) -> None:
        reason = mooncake_available()
        if reason is not None:
            raise ProcessError(f"MooncakeConnector cannot run here: {reason}")
        proxy_port, prefill_port, decode_port, bootstrap_port = free_ports(4)
        shim = write_mooncake_shim(self.log_dir / "mooncake-shim")
        engines = (
            PeerEngine(
                "prefill",
                prefill_port,
                mooncake_transfer_config("kv_producer", PREFILL_ENGINE_ID),
                mooncake_engine_env(shim, bootstrap_port),
            ),
            PeerEngine(
                "decode",
                decode_port,
                mooncake_transfer_config("kv_consumer", DECODE_ENGINE_ID),
                mooncake_engine_env(shim, None),
            ),
        )

        def proxy(prefill: str, decode: str) -> ManagedProcess:
            bootstrap = f"http://{HOST}:{bootstrap_port}"
            log_path = self.log_dir / "proxy.log"
            return mooncake_proxy_process(
                proxy_port,
                [prefill],
                [decode],
                bootstrap,
                PREFILL_ENGINE_ID,
                log_path,
                self.proxy_args,
            )

        self._launch("mooncake", engines, proxy, proxy_port, progress)
