"""Orchestrator-side handle of one engine process (see :mod:`support.pd.engine_main`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

from support.pd.protocol import (
    Command,
    EngineSnapshot,
    EngineSpec,
    Event,
    Failed,
    Finished,
    Ready,
    Reply,
    ResetPrefixCache,
    Shutdown,
    Submit,
    SubmitBatch,
    TakeSnapshot,
)

LOG_TAIL_BYTES = 4000
T = TypeVar("T")


class EngineError(RuntimeError):
    """An engine process failed, died or did not answer in time."""


class EngineProcess:
    """Starts, drives and stops one engine process."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.ready: Ready | None = None
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._finished: deque[Finished] = deque()
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
        """Spawn the process and wait until its engine is built."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        from support.pd.engine_main import engine_main

        process = ctx.Process(
            target=engine_main, args=(self.spec, child), name=f"moriio-{self.name}", daemon=True
        )
        process.start()
        child.close()
        self._conn, self._process = parent, process
        event = self._next_event(timeout_s, "to start")
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

    def pump(self) -> None:
        """Receive every event already waiting on the pipe (non-blocking)."""
        conn = self.connection
        while conn.poll():
            self._accept(self._recv())

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
        self._process = self._conn = None
        if process is not None:
            process.join(timeout_s)
            if process.is_alive():
                process.terminate()
                process.join(5.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)
            self.exitcode = process.exitcode
        if conn is not None:
            conn.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.request_stop()
        self.join(timeout_s)

    def kill(self, timeout_s: float = 10.0) -> None:
        """Crash the engine: SIGKILL its process (no shutdown, nothing flushed) and reap it.

        The handle is stopped afterwards (:attr:`exitcode` is ``-SIGKILL``); calling it on a
        stopped handle does nothing.
        """
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None:
            process.kill()
            process.join(timeout_s)
            self.exitcode = process.exitcode
        if conn is not None:
            conn.close()

    @property
    def alive(self) -> bool:
        """Whether the engine process is running."""
        return self._process is not None and self._process.is_alive()

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

    def _accept(self, event: Event) -> Event | None:
        if isinstance(event, Finished):
            self._finished.append(event)
            return None
        return event

    def _next_event(self, timeout_s: float, what: str) -> Event:
        deadline = time.monotonic() + timeout_s
        conn = self.connection
        while True:
            if conn.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                return self._recv()
            process = self._process
            if process is not None and not process.is_alive():
                if conn.poll():
                    return self._recv()
                raise self._error(f"exited with code {process.exitcode}")
            if time.monotonic() >= deadline:
                raise self._error(f"took more than {timeout_s:.0f} s {what}")

    def _await(self, kind: type[T], timeout_s: float, what: str) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._accept(self._next_event(max(0.0, deadline - time.monotonic()), what))
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
