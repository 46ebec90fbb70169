"""Main of one engine process (``python -m`` this module): a vLLM ``LLM`` with its engine
core in-process, behind a command connection.

The process dials back to the orchestrator's listener (``--address``, the key in
``MORIIO_ENGINE_AUTHKEY``), receives its :class:`~moriio_tools.engines.protocol.EngineSpec`,
pins itself to the spec's cores, builds the engine and answers
:class:`~moriio_tools.engines.protocol.Ready`.

With ``stepping="when-busy"`` the loop steps the engine whenever its scheduler has work and
otherwise waits on the connection. "Work" includes finished requests whose blocks a KV
connector still holds for a peer: in single-process mode nothing else steps the engine, yet
releases from the decode engine and write completions are only processed inside steps. While
only such transfers are pending (nothing runnable) the loop waits ``idle_wait_s`` between
steps instead of spinning. With ``stepping="engine-core"`` the loop is vLLM's own engine
core's (``EngineCore.run_busy_loop``): it waits on the connection while the core has no work
(no unfinished request, none finished whose blocks a connector still holds, no pending
push), otherwise steps, and sleeps 1 ms after a step that ran no model while the scheduler
still has requests.

vLLM, torch and the connector are imported only once the spec's cores are set, so every
thread they start inherits them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, cast

from moriio.domain.worker.stats import WorkerStats
from moriio_tools.engines.prompt_sources import LoadedKV
from moriio_tools.engines.protocol import (
    EngineSnapshot,
    EngineSpec,
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
from moriio_tools.engines.spans import SpanRecorder
from moriio_tools.models.store import ensure_model

AUTHKEY_ENV = "MORIIO_ENGINE_AUTHKEY"
PARENT_CHECK_S = 0.5
ENGINE_CORE_IDLE_STEP_S = 0.001  # vLLM's engine core, after a step that ran no model


def engine_main(conn: Connection) -> int:
    """Serve one engine over ``conn``; the process's exit status.

    Freezes the garbage collector before returning: the interpreter's final full collection
    over vLLM's heap would otherwise take several seconds and has nothing left to release.
    """
    status = 0
    engine: _Engine | None = None
    try:
        spec = conn.recv()
        if not isinstance(spec, EngineSpec):
            raise TypeError(f"expected an EngineSpec, got {type(spec).__name__}")
        if spec.cores:
            os.sched_setaffinity(0, set(spec.cores))
        engine = _Engine(spec)
        conn.send(engine.ready)
        engine.serve(conn)
    except BaseException:  # reported to the orchestrator, then the process ends
        status = 1
        _report(conn, traceback.format_exc())
    finally:
        if engine is not None and not engine.close():
            status = status or 1
        sys.stdout.flush()
        sys.stderr.flush()
        conn.close()
    gc.freeze()
    return status


def _report(conn: Connection, text: str) -> None:
    print(text, file=sys.stderr, flush=True)
    with contextlib.suppress(OSError, ValueError):
        conn.send(Failed(text))


class _Engine:
    def __init__(self, spec: EngineSpec) -> None:
        started = time.monotonic()
        self.spec = spec
        cache = spec.model_cache_dir
        model_dir = (
            Path(spec.model_dir) if spec.model_dir else ensure_model(Path(cache) if cache else None)
        )
        from vllm import LLM
        from vllm.config import KVTransferConfig

        transfer = spec.kv_transfer_config
        self.llm = cast(Any, LLM)(
            model=str(model_dir),
            load_format="auto",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=spec.max_model_len,
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            disable_log_stats=not spec.log_stats,
            enforce_eager=True,
            distributed_executor_backend="uni",
            block_size=spec.block_size,
            seed=0,
            enable_prefix_caching=True,
            kv_transfer_config=None if transfer is None else KVTransferConfig(**transfer),
        )
        self.engine: Any = self.llm.llm_engine
        self.prompt_sources = LoadedKV(self.engine)
        self._started: set[str] = set()  # requests whose first token was reported
        self.scheduler: Any = self.engine.engine_core.engine_core.scheduler
        self.spans: SpanRecorder | None = None
        self.worker: Any = _worker_service()
        if self.worker is not None:
            self.spans = SpanRecorder(self.worker.ctx.clock)
            self.worker.observe_batches(self.spans.observe)
        pool = self.scheduler.kv_cache_manager.block_pool
        self.ready = Ready(
            name=spec.name,
            startup_s=time.monotonic() - started,
            num_blocks=pool.num_gpu_blocks,
            pid=os.getpid(),
            model_dir=str(model_dir),
        )
        self._stopping = False
        self._closed = False
        self._parent = os.getppid()

    # -- loop ----------------------------------------------------------------------------

    def serve(self, conn: Connection) -> None:
        if self.spec.stepping == "engine-core":
            self._serve_as_engine_core(conn)
            return
        while not self._stopping:
            busy = self.scheduler.has_requests()
            if busy:
                timeout = 0.0 if self._runnable() else self.spec.idle_wait_s
            else:
                timeout = PARENT_CHECK_S
            if conn.poll(timeout):
                while not self._stopping and conn.poll():
                    self._handle(conn, conn.recv())
            elif not busy and os.getppid() != self._parent:
                return  # orphaned: the orchestrator is gone
            if not self._stopping and self.scheduler.has_requests():
                self._step(conn)

    def _serve_as_engine_core(self, conn: Connection) -> None:
        """vLLM's ``EngineCore.run_busy_loop``: commands play its input queue."""
        core = self.engine.engine_core.engine_core
        executed = _ModelExecuted(core)

        def has_work() -> bool:  # EngineCoreProc.has_work, without data parallelism
            return bool(self.scheduler.has_requests() or core.batch_queue)

        while not self._stopping:
            # its _process_input_queue: block until there is work
            if not has_work() and not conn.poll(PARENT_CHECK_S):
                if os.getppid() != self._parent:
                    return  # orphaned: the orchestrator is gone
                continue
            while not self._stopping and conn.poll():
                self._handle(conn, conn.recv())
            if self._stopping or not has_work():
                continue
            self._step(conn)  # its _process_engine_step
            if not executed.last and self.scheduler.has_requests():
                time.sleep(ENGINE_CORE_IDLE_STEP_S)

    def _runnable(self) -> bool:
        """True when the next step would run a forward (not only poll transfers)."""
        from vllm.v1.request import RequestStatus

        sched = self.scheduler
        if sched.running:
            return True
        return any(r.status != RequestStatus.WAITING_FOR_REMOTE_KVS for r in sched.waiting)

    def _step(self, conn: Connection) -> None:
        for output in self.engine.step():
            now, key = time.time(), output.request_id
            completion = output.outputs[0] if output.outputs else None
            if self._first_token(key, completion):
                conn.send(FirstToken(key, now))
            if not output.finished:
                continue
            self._started.discard(key)
            params = output.kv_transfer_params
            conn.send(
                Finished(
                    key=key,
                    token_ids=tuple(completion.token_ids) if completion is not None else (),
                    kv_transfer_params=dict(params) if params else None,
                    finish_reason=completion.finish_reason if completion is not None else None,
                    wall_time=now,
                )
            )

    def _first_token(self, key: str, completion: Any) -> bool:
        """Whether ``completion`` brings request ``key``'s first token, to be reported."""
        if not self.spec.report_first_tokens or completion is None or key in self._started:
            return False
        if not completion.token_ids:
            return False
        self._started.add(key)
        return True

    def _settle(self, conn: Connection, timeout_s: float) -> bool:
        """Step until the scheduler is idle (held blocks released) or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler.has_requests():
            if time.monotonic() >= deadline:
                return False
            self._step(conn)
            if not self._runnable():
                time.sleep(self.spec.idle_wait_s)
        return True

    # -- commands ------------------------------------------------------------------------

    def _handle(self, conn: Connection, command: object) -> None:
        match command:
            case SubmitBatch(requests=requests):
                for request in requests:
                    self._submit(request)
            case TakeSnapshot(settle_timeout_s=timeout):
                settled = self._settle(conn, timeout)
                conn.send(self.snapshot(settled))
            case ResetPrefixCache(timeout_s=timeout):
                settled = self._settle(conn, timeout)
                ok = settled and bool(self.llm.reset_prefix_cache())
                conn.send(Reply(ok, "" if ok else "blocks still in use"))
            case Shutdown():
                self._stopping = True
            case _:
                raise TypeError(f"unknown command {type(command).__name__}")

    def _submit(self, request: Submit) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra = (
            {"kv_transfer_params": dict(request.kv_transfer_params)}
            if request.kv_transfer_params
            else None
        )
        params = SamplingParams(
            temperature=0.0,
            max_tokens=request.max_tokens,
            ignore_eos=True,
            detokenize=False,
            extra_args=extra,
        )
        self.engine.add_request(
            request.key, TokensPrompt(prompt_token_ids=list(request.prompt)), params
        )

    def snapshot(self, settled: bool) -> EngineSnapshot:
        pool = self.scheduler.kv_cache_manager.block_pool
        counters: dict[str, int] = {}
        kinds: dict[str, int] = {}
        worker = self.worker
        if worker is not None:
            stats: WorkerStats = worker.stats_snapshot()
            counters = stats.counts()
            kinds = dict(stats.failures_by_kind)
        return EngineSnapshot(
            name=self.spec.name,
            free_blocks=pool.get_num_free_blocks(),
            usable_blocks=pool.num_gpu_blocks - 1,
            scheduler_requests=len(self.scheduler.requests),
            counters=counters,
            failures_by_kind=kinds,
            transfers=self.spans.spans() if self.spans is not None else (),
            settled=settled,
            prompt_sources=dict(self.prompt_sources.sources),
            loaded_requests=self.prompt_sources.requests,
            threads={t.native_id: t.name for t in threading.enumerate() if t.native_id},
        )

    def close(self) -> bool:
        """Shut the engine down (once); False when that raised (the error is logged)."""
        if self._closed:
            return True
        self._closed = True
        started = time.monotonic()
        try:
            self.engine.engine_core.shutdown()
        except Exception:
            print(f"engine shutdown failed:\n{traceback.format_exc()}", file=sys.stderr)
            return False
        print(f"engine shut down in {time.monotonic() - started:.2f} s", flush=True)
        return True


class _ModelExecuted:
    """Records whether the engine core's last step ran the model (``step_fn``'s flag,
    which ``LLMEngine.step`` drops)."""

    def __init__(self, core: Any) -> None:
        self.last = False
        step_fn = core.step_fn

        def recorded() -> Any:
            outputs, model_executed = step_fn()
            self.last = bool(model_executed)
            return outputs, model_executed

        core.step_fn = recorded


def _worker_service() -> Any:
    """The worker-role connector's service (single-process engine: same process)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return None
    worker_side = getattr(get_kv_transfer_group(), "worker_side", None)
    return getattr(worker_side, "service", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True, help="host:port of the orchestrator")
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=os.environ[AUTHKEY_ENV].encode())
    sys.exit(engine_main(conn))


if __name__ == "__main__":
    main()
