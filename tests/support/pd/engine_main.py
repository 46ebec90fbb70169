"""Main of one engine process: a vLLM ``LLM`` (in-process engine core) behind a command pipe.

The loop steps the engine whenever its scheduler has work and otherwise waits on the pipe.
"Work" includes finished requests whose blocks a KV connector still holds for a peer: in
single-process mode nothing else steps the engine, yet releases from the decode engine and
write completions are only processed inside steps. While only such transfers are pending
(nothing runnable) the loop waits ``idle_wait_s`` on the pipe between steps instead of
spinning.

vLLM, torch and the connector are imported here, inside the spawned process, after the
environment has been set.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from moriio.domain.worker.stats import WorkerStats
from moriio_tools.harness import LoadedKV, ensure_model
from support.pd.protocol import (
    EngineSnapshot,
    EngineSpec,
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
from support.pd.spans import SpanRecorder

PARENT_CHECK_S = 0.5


def engine_main(spec: EngineSpec, conn: Connection) -> None:
    """Process entry point (``multiprocessing`` spawn target).

    Freezes the garbage collector before exiting: the interpreter's final full collection
    over vLLM's heap would otherwise take several seconds and has nothing left to release.
    """
    _redirect_output(spec.log_path)
    os.environ.pop("VLLM_TARGET_DEVICE", None)
    os.environ.update(spec.env)
    status = 0
    engine: _Engine | None = None
    try:
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
    sys.exit(status)


def _report(conn: Connection, text: str) -> None:
    print(text, file=sys.stderr, flush=True)
    with contextlib.suppress(OSError, ValueError):
        conn.send(Failed(text))


def _redirect_output(log_path: str | None) -> None:
    """Send this process's stdout and stderr (file descriptors too) to ``log_path``."""
    if log_path is None:
        return
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _Engine:
    def __init__(self, spec: EngineSpec) -> None:
        started = time.monotonic()
        self.spec = spec
        cache = spec.model_cache_dir
        model_dir = ensure_model(Path(cache) if cache else None)
        from vllm import LLM
        from vllm.config import KVTransferConfig

        self.llm = cast(Any, LLM)(
            model=str(model_dir),
            load_format="auto",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=spec.max_model_len,
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            enforce_eager=True,
            block_size=spec.block_size,
            seed=0,
            enable_prefix_caching=True,
            kv_transfer_config=KVTransferConfig(
                kv_connector=spec.connector.class_name,
                kv_connector_module_path=spec.connector.module_path,
                kv_role=spec.kv_role,
                kv_connector_extra_config=dict(spec.extra_config),
            ),
        )
        self.engine: Any = self.llm.llm_engine
        self.prompt_sources = LoadedKV(self.engine)
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

    def _runnable(self) -> bool:
        """True when the next step would run a forward (not only poll transfers)."""
        from vllm.v1.request import RequestStatus

        sched = self.scheduler
        if sched.running:
            return True
        return any(r.status != RequestStatus.WAITING_FOR_REMOTE_KVS for r in sched.waiting)

    def _step(self, conn: Connection) -> None:
        for output in self.engine.step():
            if not output.finished:
                continue
            completion = output.outputs[0] if output.outputs else None
            params = output.kv_transfer_params
            conn.send(
                Finished(
                    key=output.request_id,
                    token_ids=tuple(completion.token_ids) if completion is not None else (),
                    kv_transfer_params=dict(params) if params else None,
                    finish_reason=completion.finish_reason if completion is not None else None,
                )
            )

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


def _worker_service() -> Any:
    """The worker-role connector's service (single-process engine: same process)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return None
    worker_side = getattr(get_kv_transfer_group(), "worker_side", None)
    return getattr(worker_side, "service", None)
