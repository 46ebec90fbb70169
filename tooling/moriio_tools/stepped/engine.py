"""One vLLM engine stepped without pause, in its own process (``python -m`` this module).

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the in-process
executor), every thread of it on the cores ``MORIIO_STEPPED_CORES`` names, and the loop calls
``LLMEngine.step()`` back to back, with or without requests: the way a saturated engine
behaves, and the one setting in which a connector that only moves on the engine's steps
(vLLM's NixlConnector with its progress thread off) makes progress.

It connects to the coordinator's ``multiprocessing.connection`` listener and speaks tuples:

* in: ``("add", request_id, prompt_token_ids, max_tokens, kv_transfer_params | None)``,
  ``("loaded",)``, ``("stop",)``;
* out: ``("ready",)`` once built, ``("first", request_id, wall_time)`` with a request's first
  token, ``("done", request_id, token_ids, kv_transfer_params, wall_time)`` when it ends,
  ``("loaded", requests, sources)``: how many requests had prompt KV loaded by the connector,
  and the prompt tokens per source so far (vLLM's own prefill stats, in the vocabulary of
  :data:`moriio_tools.serve.metrics.PROMPT_SOURCES`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from multiprocessing.connection import Client, Connection
from typing import Any

from moriio_tools.serve.metrics import CACHED, COMPUTED, LOADED, PROMPT_SOURCES

ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
CORES_ENV = "MORIIO_STEPPED_CORES"  # e.g. "0" or "0,1": the cores the whole engine runs on


def build_engine(model: str, kv_transfer_config: dict[str, Any] | None) -> Any:
    """The served deployments' engine settings (:func:`moriio_tools.serve.processes.vllm_server`)
    on the in-process executor."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from moriio_tools.serve.processes import ENGINE_SETTINGS

    args = EngineArgs(
        model=model,
        enforce_eager=True,
        distributed_executor_backend="uni",
        **ENGINE_SETTINGS,  # type: ignore[arg-type]
        kv_transfer_config=(
            None if kv_transfer_config is None else KVTransferConfig(**kv_transfer_config)
        ),
    )
    return LLMEngine.from_engine_args(args)


class LoadedKV:
    """Counts, from the engine core's outputs, where each request's prompt tokens came from:
    loaded by the connector, found in the prefix cache, or computed."""

    def __init__(self, engine: Any) -> None:
        self.requests = 0  # requests with some prompt KV loaded by the connector
        self.sources = dict.fromkeys(PROMPT_SOURCES, 0)
        client = engine.engine_core
        inner = client.get_output

        def get_output() -> Any:
            outputs = inner()
            for output in outputs.outputs:
                stats = output.prefill_stats  # once per request, as first scheduled
                if stats is None:
                    continue
                self.requests += stats.num_external_cached_tokens > 0
                self.sources[LOADED] += stats.num_external_cached_tokens
                self.sources[CACHED] += stats.num_local_cached_tokens
                self.sources[COMPUTED] += stats.num_computed_tokens
            return outputs

        client.get_output = get_output


def serve(engine: Any, conn: Connection) -> None:
    """Step ``engine`` until told to stop, taking requests between steps."""
    from vllm import SamplingParams

    loaded = LoadedKV(engine)
    started: set[str] = set()
    while True:
        while conn.poll():
            message = conn.recv()
            if message[0] == "stop":
                return
            if message[0] == "loaded":
                conn.send(("loaded", loaded.requests, dict(loaded.sources)))
                continue
            _, request_id, prompt, max_tokens, params = message
            sampling = SamplingParams(
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=True,
                extra_args=None if params is None else {"kv_transfer_params": params},
            )
            engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, sampling)
        for output in engine.step():
            now, rid = time.time(), output.request_id
            tokens = list(output.outputs[0].token_ids) if output.outputs else []
            if tokens and rid not in started:
                started.add(rid)
                conn.send(("first", rid, now))
            if output.finished:
                started.discard(rid)
                conn.send(("done", rid, tokens, output.kv_transfer_params, now))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--address", required=True, help="host:port of the coordinator")
    parser.add_argument("--kv-transfer-config", help="JSON, as vllm serve takes it")
    args = parser.parse_args()
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    cores = os.environ.get(CORES_ENV)
    if cores:  # before any thread starts: every thread of the engine inherits it
        os.sched_setaffinity(0, {int(core) for core in cores.split(",")})
        os.environ["OMP_NUM_THREADS"] = str(len(cores.split(",")))
    host, port = args.address.rsplit(":", 1)
    authkey = os.environ["MORIIO_STEPPED_AUTHKEY"].encode()
    config = None if args.kv_transfer_config is None else json.loads(args.kv_transfer_config)
    engine = build_engine(args.model, config)
    conn = Client((host, int(port)), authkey=authkey)
    conn.send(("ready",))
    try:
        serve(engine, conn)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
