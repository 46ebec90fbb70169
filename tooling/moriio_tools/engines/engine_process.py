"""Orchestrator-side handle of one engine process (see :mod:`moriio_tools.engines.engine_main`).

The process is a :class:`~moriio_tools.serve.processes.ManagedProcess` (the tools' one way of
running a child: its log, its own session, stopped with the tool), a fresh interpreter
started with the spec's environment, so settings read once at start-up (the OpenMP thread
count, ``PYTHONPATH``) take effect. It dials back to a listener this handle opened with a key
of its own and receives the spec there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import TypeVar

from moriio_tools.engines.engine_main import AUTHKEY_ENV
from moriio_tools.engines.protocol import (
    Command,
    EngineSnapshot,
    EngineSpec,
    Event,
    Failed,
    Finished,
    FirstToken,
    Ready,
    Reply,
    ResetPrefixCache,
    Shutdown,
    Submit,
    SubmitBatch,
    TakeSnapshot,
)
from moriio_tools.serve.processes import HOST, ManagedProcess

LOG_TAIL_BYTES = 4000
T = TypeVar("T")


class EngineError(RuntimeError):
    """An engine process failed, died or did not answer in time."""


class EngineProcess:
    """Starts, drives and stops one engine process."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.ready: Ready | None = None
        self._listener: Listener | None = None
        self._dialled_back: threading.Thread | None = None  # accepts the call, sends the spec
        self._handed_over: Connection | None = None
        self._conn: Connection | None = None
        self._process: ManagedProcess | None = None
        self._finished: deque[Finished] = deque()
        self._first_tokens: deque[FirstToken] = deque()
        self.exitcode: int | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def connection(self) -> Connection:
        if self._conn is None:
            raise EngineError(f"engine {self.name} is not running")
        return self._conn

    def start(self, timeout_s: float = 300.0) -> Ready:
        """Start the process and wait until its engine is built."""
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process (returns at once; :meth:`wait_ready` waits for its engine)."""
        authkey = secrets.token_hex(16)
        self._listener = Listener((HOST, 0), authkey=authkey.encode())
        host, port = self._listener.address
        env = {**self.spec.env, AUTHKEY_ENV: authkey}
        if self.spec.cores:
            env["OMP_NUM_THREADS"] = str(len(self.spec.cores))
        argv = [sys.executable, "-m", "moriio_tools.engines.engine_main"]
        log = self.spec.log_path
        self._process = ManagedProcess(
            f"engine {self.name}",
            [*argv, "--address", f"{host}:{port}"],
            log_path=Path(log) if log is not None else Path(os.devnull),
            ready_url="",  # ready once it says so over the connection
            env=env,
        )
        try:
            self._process.start()
        except BaseException:
            self._close_listener()
            raise
        self._dialled_back = threading.Thread(
            target=self._hand_over_spec, args=(self._listener,), name=f"accept-{self.name}"
        )
        self._dialled_back.daemon = True
        self._dialled_back.start()

    def wait_ready(self, timeout_s: float = 300.0) -> Ready:
        """Wait until the launched engine dialled back and is built (bounded). Several
        engines launched first are built side by side."""
        deadline = time.monotonic() + timeout_s
        self._conn = self._accepted(timeout_s)
        event = self._next_event(max(0.0, deadline - time.monotonic()), "to start")
        if not isinstance(event, Ready):
            raise EngineError(f"engine {self.name}: unexpected {type(event).__name__} at start")
        self.ready = event
        return event

    def submit(self, requests: Sequence[Submit]) -> None:
        if requests:
            self._send(SubmitBatch(tuple(requests)))

    def take_finished(self) -> list[Finished]:
        """Finished requests received so far (call :meth:`pump` to receive more)."""
        out = list(self._finished)
        self._finished.clear()
        return out

    def take_first_tokens(self) -> list[FirstToken]:
        """First tokens received so far (with :attr:`EngineSpec.report_first_tokens`)."""
        out = list(self._first_tokens)
        self._first_tokens.clear()
        return out

    def pump(self) -> None:
        """Receive every event already waiting on the pipe (non-blocking)."""
        conn = self.connection
        while conn.poll():
            self._keep(self._recv())

    def snapshot(self, settle_timeout_s: float = 10.0) -> EngineSnapshot:
        """Block usage and counters, after stepping until idle (bounded by the timeout)."""
        self._send(TakeSnapshot(settle_timeout_s))
        return self._await(EngineSnapshot, settle_timeout_s + 60.0, "to report")

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> None:
        self._send(ResetPrefixCache(timeout_s))
        reply = self._await(Reply, timeout_s + 60.0, "to reset its prefix cache")
        if not reply.ok:
            raise EngineError(f"engine {self.name}: prefix cache reset refused: {reply.detail}")

    def request_stop(self) -> None:
        """Ask the engine to shut down (returns at once; see :meth:`join`)."""
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(Shutdown())

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for the process to exit; terminate, then kill it, if it does not in time."""
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        self._close_listener()
        if process is not None:
            process.exited(timeout_s)
            self.exitcode = process.stop(grace=5.0)
        if conn is not None:
            conn.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.request_stop()
        self.join(timeout_s)

    def kill(self) -> None:
        """Crash the engine: SIGKILL its process (no shutdown, nothing flushed) and reap it.

        The handle is stopped afterwards (:attr:`exitcode` is ``-SIGKILL``); calling it on a
        stopped handle does nothing.
        """
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        self._close_listener()
        if process is not None:
            self.exitcode = process.kill()
        if conn is not None:
            conn.close()

    @property
    def alive(self) -> bool:
        """Whether the engine process is running."""
        return self._process is not None and self._process.running()

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of the engine's log file ('' when it logs to the terminal)."""
        if self.spec.log_path is None:
            return ""
        path = Path(self.spec.log_path)
        try:
            data = path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    # -- internals -----------------------------------------------------------------------

    def _hand_over_spec(self, listener: Listener) -> None:
        """Accept the engine's call and send it its spec (closing the listener ends it)."""
        with contextlib.suppress(OSError, EOFError, AuthenticationError):
            conn = listener.accept()
            try:
                conn.send(self.spec)
            except (OSError, ValueError):
                conn.close()
                return
            self._handed_over = conn

    def _accepted(self, timeout_s: float) -> Connection:
        """The engine's connection once it dialled back and has its spec; EngineError if it
        exits first or takes longer than ``timeout_s``."""
        thread = self._dialled_back
        if thread is None:
            raise EngineError(f"engine {self.name} was not launched")
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and self.alive and time.monotonic() < deadline:
            thread.join(0.5)
        self._close_listener()
        thread.join(5.0)
        conn, self._handed_over = self._handed_over, None
        if conn is None:
            exited = "" if self.alive else " (it exited)"
            raise self._error(f"did not dial back within {timeout_s:.0f} s{exited}")
        return conn

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def _send(self, command: Command) -> None:
        try:
            self.connection.send(command)
        except (OSError, ValueError) as exc:
            raise self._error(f"cannot be reached ({exc})") from exc

    def _recv(self) -> Event:
        try:
            event: Event = self.connection.recv()
        except (EOFError, OSError) as exc:
            raise self._error("exited unexpectedly") from exc
        if isinstance(event, Failed):
            raise self._error(f"failed:\n{event.error}")
        return event

    def _keep(self, event: Event) -> Event | None:
        """Queue request events; anything else is the caller's."""
        if isinstance(event, Finished):
            self._finished.append(event)
            return None
        if isinstance(event, FirstToken):
            self._first_tokens.append(event)
            return None
        return event

    def _next_event(self, timeout_s: float, what: str) -> Event:
        deadline = time.monotonic() + timeout_s
        conn = self.connection
        while True:
            if conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                return self._recv()
            process = self._process
            if process is not None and not process.running():
                if conn.poll():
                    return self._recv()
                raise self._error(f"exited with code {process.returncode}")
            if time.monotonic() >= deadline:
                raise self._error(f"took more than {timeout_s:.0f} s {what}")

    def _await(self, kind: type[T], timeout_s: float, what: str) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._keep(self._next_event(max(0.0, deadline - time.monotonic()), what))
            if event is None:
                continue
            if isinstance(event, kind):
                return event
            raise self._error(f"sent {type(event).__name__} while waiting {what}")

    def _error(self, message: str) -> EngineError:
        tail = self.log_tail()
        suffix = f"\n--- end of {self.spec.log_path} ---\n{tail}" if tail else ""
        return EngineError(f"engine {self.name} {message}{suffix}")


def stop_all(engines: Sequence[EngineProcess], timeout_s: float = 30.0) -> None:
    """Shut several engines down concurrently."""
    for engine in engines:
        engine.request_stop()
    for engine in engines:
        engine.join(timeout_s)
