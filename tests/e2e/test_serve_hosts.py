"""Routers people deploy in front of ``vllm serve`` engines on two "hosts".

The prefill engine serves on 127.0.0.2 and the decode engine on 127.0.0.3 (addresses of
their own, as pods have), their control sockets on every interface (the default), each
trusting the other through a CIDR range.

* llm-d: a driver sends exactly what llm-d's nixlv2 connector sends: plain READ (no transfer
  id, no addresses), MoRIIO WRITE serial and parallel; and plain READ to a prefill of 2 DP
  ranks, each request pinned to a rank.
* vllm-router: the engines register themselves; then the prefill engine's interpreter is held
  in a native call for 6 s, and a request sent 5.5 s into it must still be routed (vllm-router
  drops an engine silent for 5 s); then, the control on the same engines, its heartbeat is
  frozen with it, and the router must have dropped it.

Every output must equal a plain engine's, the decode must compute no prompt token (all came
over the wire), nothing may stay held and no leg may answer 503.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from moriio_tools.harness import (
    Completion,
    ManagedProcess,
    Prompt,
    ServeDemoConfig,
    free_ports,
    held_blocks,
    http_get,
    parse,
    prompt_tokens_by_source,
    run_batch,
    vllm_router_binary,
    vllm_router_process,
    vllm_server,
)
from support.llama_reference import LlamaReference
from support.llmd_sidecar import Sidecar, SidecarConfig, pick_dp_rank
from support.prompt_kv import assert_prompt_kv_over_the_wire

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PREFILL_HOST, DECODE_HOST = "127.0.0.2", "127.0.0.3"
REQUESTS = 4


@pytest.fixture(scope="module")
def reference(llama_reference: LlamaReference) -> tuple[Path, list[Prompt], list[Any]]:
    model_dir, prompts, expected = llama_reference.prompt_set("hosts")
    assert len(prompts) == REQUESTS
    return model_dir, prompts, expected


def _engine(
    role: str,
    host: str,
    ports: tuple[int, int, int],
    mode: str,
    model_dir: Path,
    logs: Path,
    *,
    extra: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    dp_size: int = 1,
) -> ManagedProcess:
    http, handshake, notify = ports
    stalling = env is not None
    config = {
        "kv_connector": "StallingMoriioKVConnector" if stalling else "MoriioKVConnector",
        "kv_connector_module_path": "stalling_connector" if stalling else "moriio.vllm_plugin",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_connector_extra_config": {
            "transport": "nixl",
            "read_mode": mode == "read",
            "host_ip": host,
            "handshake_port": handshake,
            "notify_port": notify,
            "trusted_remote_hosts": ["127.0.0.0/8"],
            **(extra or {}),
        },
    }
    return vllm_server(
        role,
        model_dir,
        http,
        log_path=logs / f"{role}.log",
        kv_transfer_config=config,
        extra_args=[*ServeDemoConfig().all_engine_args(), "--data-parallel-size", str(dp_size)],
        # vLLM binds DP rank r to the r-th list. A prefill's ranks share core 0 and the decode
        # keeps core 1: an engine bound beside another's spinning threads answers its peers'
        # handshakes too late (a decode beside a prefill rank: tens of seconds here).
        cpu_bind="0|0" if dp_size > 1 else "0" if role == "prefill" else "1",
        host=host,
        extra_env=env,
    )


def _ports(host: str, dp_size: int) -> tuple[int, int, int]:
    """HTTP, handshake and notify ports; DP rank r listens at handshake + r and notify + r."""
    for _ in range(64):
        http, handshake, notify = free_ports(3, host)
        ranked = {handshake + r for r in range(dp_size)} | {notify + r for r in range(dp_size)}
        if (
            http not in ranked
            and len(ranked) == 2 * dp_size
            and all(_bindable(host, port) for port in ranked)
        ):
            return http, handshake, notify
    raise AssertionError(f"no free ports for {dp_size} DP ranks on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@contextmanager
def _pair(
    mode: str, model_dir: Path, logs: Path, prefill_dp: int = 1
) -> Iterator[dict[str, tuple[int, int, int]]]:
    ports = {"prefill": _ports(PREFILL_HOST, prefill_dp), "decode": _ports(DECODE_HOST, 1)}
    engines = [
        _engine(role, host, ports[role], mode, model_dir, logs, dp_size=dp)
        for role, host, dp in (("prefill", PREFILL_HOST, prefill_dp), ("decode", DECODE_HOST, 1))
    ]
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_ready(600.0)
        yield ports
    finally:
        for engine in engines:
            engine.stop()


def _sidecar_config(
    ports: dict[str, tuple[int, int, int]], *, write: bool, parallel: bool, dp_size: int = 1
) -> SidecarConfig:
    return SidecarConfig(
        dp_size=dp_size,
        prefill_url=f"http://{PREFILL_HOST}:{ports['prefill'][0]}",
        decode_url=f"http://{DECODE_HOST}:{ports['decode'][0]}",
        decode_pod_ip=DECODE_HOST,
        write_mode=write,
        parallel_dispatch=parallel,
        decode_handshake_port=ports["decode"][1],
        decode_notify_port=ports["decode"][2],
        prefill_handshake_port=ports["prefill"][1],
        prefill_notify_port=ports["prefill"][2],
    )


def _drive(
    config: SidecarConfig, model: str, prompts: list[Prompt], request_ids: list[str] | None = None
) -> tuple[list[Completion], list[tuple[str, int]]]:
    async def run() -> tuple[list[Completion], list[tuple[str, int]]]:
        sidecar = Sidecar(config, request_ids=iter(request_ids or ()))
        runner = web.AppRunner(sidecar.app())
        await runner.setup()
        (port,) = free_ports(1)
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            url = f"http://127.0.0.1:{port}/v1/completions"
            max_tokens = ServeDemoConfig().max_tokens
            out = await run_batch(url, model, list(enumerate(prompts)), max_tokens, gap_s=0.5)
        finally:
            await runner.cleanup()
        return out, sidecar.statuses

    return asyncio.run(run())


def _decode_sources(ports: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """Prompt tokens by source on the decode, now."""
    status, body = http_get(f"http://{DECODE_HOST}:{ports['decode'][0]}/metrics")
    assert status == 200
    return prompt_tokens_by_source(parse(body))


def _decode_metrics(ports: dict[str, tuple[int, int, int]]) -> tuple[dict[str, int], int, int]:
    """Prompt tokens by source on the decode, and blocks held on each side once settled."""
    sources, held_prefill, held_decode, _ = _settled_metrics(ports)
    return sources, held_prefill, held_decode


def _settled_metrics(
    ports: dict[str, tuple[int, int, int]],
) -> tuple[dict[str, int], int, int, dict[str, dict[str, int]]]:
    """:func:`_decode_metrics`, and each engine's (DP rank's) prompt tokens by source, per
    role and rank (``"prefill/0"``)."""
    deadline = time.monotonic() + 60.0
    while True:
        held = []
        by_rank: dict[str, dict[str, int]] = {}
        for host, role in ((PREFILL_HOST, "prefill"), (DECODE_HOST, "decode")):
            status, body = http_get(f"http://{host}:{ports[role][0]}/metrics")
            assert status == 200
            samples = parse(body)
            held.append(held_blocks(samples))
            if role == "decode":
                sources = prompt_tokens_by_source(samples)
            for rank in sorted({s.labels.get("engine", "0") for s in samples}):
                mine = [s for s in samples if s.labels.get("engine", "0") == rank]
                by_rank[f"{role}/{rank}"] = prompt_tokens_by_source(mine)
        if held == [0, 0] or time.monotonic() > deadline:
            return sources, held[0], held[1], by_rank
        time.sleep(1.0)


@pytest.mark.parametrize(
    ("mode", "flows"), [("read", [(False, False)]), ("write", [(True, False), (True, True)])]
)
def test_llm_d_requests_move_the_prompt_kv_between_two_hosts(
    reference: tuple[Path, list[Prompt], list[Any]],
    tmp_path: Path,
    mode: str,
    flows: list[tuple[bool, bool]],
) -> None:
    model_dir, prompts, expected = reference
    with _pair(mode, model_dir, tmp_path) as ports:
        sent = 0
        for write, parallel in flows:
            config = _sidecar_config(ports, write=write, parallel=parallel)
            out, statuses = _drive(config, str(model_dir), prompts)
            sent += len(prompts)
            assert [c.error for c in out] == [None] * len(prompts), (mode, parallel)
            assert [tuple(c.tokens) for c in out] == list(expected), (mode, parallel)
            assert {status for _, status in statuses} == {200}, statuses
        sources, held_prefill, held_decode = _decode_metrics(ports)
    assert_prompt_kv_over_the_wire(sources, len(flows) * sum(map(len, prompts)))
    assert held_prefill == 0
    assert held_decode == 0
    assert sent == REQUESTS * len(flows)


def _ids_for_ranks(ranks: list[int], dp_size: int) -> list[str]:
    """Request ids on which llm-d's rank pick (a hash of the id) lands on ``ranks``, in order."""
    ids: list[str] = []
    for rank in ranks:
        while pick_dp_rank(candidate := str(uuid.uuid4()), dp_size) != rank:
            pass
        ids.append(candidate)
    return ids


def test_llm_d_requests_reach_both_dp_ranks_of_the_prefill(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path
) -> None:
    """The prefill runs 2 DP ranks; llm-d's plain READ flow picks one per request
    (``x-data-parallel-rank``, a hash of the request id). Each rank hands off, and the decode
    loads every prompt token over the wire from the rank that computed it."""
    model_dir, prompts, expected = reference
    dp_size = 2
    with _pair("read", model_dir, tmp_path, prefill_dp=dp_size) as ports:
        config = _sidecar_config(ports, write=False, parallel=False, dp_size=dp_size)
        request_ids = _ids_for_ranks([r % dp_size for r in range(len(prompts))], dp_size)
        out, statuses = _drive(config, str(model_dir), prompts, request_ids)
        assert [c.error for c in out] == [None] * len(prompts)
        assert [tuple(c.tokens) for c in out] == list(expected)
        assert {status for _, status in statuses} == {200}, statuses
        sources, held_prefill, held_decode, by_rank = _settled_metrics(ports)
    assert_prompt_kv_over_the_wire(sources, sum(map(len, prompts)))
    assert held_prefill == 0
    assert held_decode == 0
    for rank in map(str, range(dp_size)):
        assert by_rank[f"prefill/{rank}"]["local_compute"] > 0, by_rank  # each rank prefilled


STALL_S = 6  # the engine holds its interpreter longer than vllm-router's 5 s cutoff
FROZEN_STALL_S = 9  # the control: its beat stops too, and the router is asked at
FROZEN_CHECK_S = 7.5  # 2.5 s past the cutoff (it counts whole seconds on its own period)


@pytest.mark.skipif(vllm_router_binary() is None, reason="needs vllm-router (.venv-router)")
def test_vllm_router_keeps_an_engine_whose_interpreter_is_held_for_six_seconds(
    reference: tuple[Path, list[Prompt], list[Any]], tmp_path: Path
) -> None:
    """Then the negative control on the same engines: the heartbeat stalls with the engine,
    as a thread of it would, and vllm-router must have dropped the engine."""
    model_dir, prompts, expected = reference
    router_port, ping_port, metrics_port = free_ports(3)
    router = vllm_router_process(
        router_port, ping_port, metrics_port, log_path=tmp_path / "router.log"
    )
    p = free_ports(3, PREFILL_HOST)
    d = free_ports(3, DECODE_HOST)
    ports = {"prefill": (p[0], p[1], p[2]), "decode": (d[0], d[1], d[2])}
    trigger = tmp_path / "stall"
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    engines = [
        _engine(
            role,
            host,
            ports[role],
            "write",
            model_dir,
            tmp_path,
            extra={
                "proxy_ip": "127.0.0.1",
                "proxy_ping_port": ping_port,
                "proxy_ping_interval": 1.0,
                "http_port": ports[role][0],
            },
            env={"PYTHONPATH": path, "MORIIO_TEST_STALL_FILE": str(trigger)}
            if role == "prefill"
            else {"PYTHONPATH": path},
        )
        for role, host in (("prefill", PREFILL_HOST), ("decode", DECODE_HOST))
    ]
    url = f"http://127.0.0.1:{router_port}/v1/completions"
    max_tokens = ServeDemoConfig().max_tokens
    indexed = list(enumerate(prompts))
    try:
        router.start()
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_ready(600.0)
        deadline = time.monotonic() + 120.0
        while http_get(f"http://127.0.0.1:{router_port}/health")[0] != 200:
            assert time.monotonic() < deadline, "engines never registered with vllm-router"
            time.sleep(0.5)
        out = asyncio.run(run_batch(url, str(model_dir), indexed, max_tokens, gap_s=0.5))
        assert [c.error for c in out] == [None] * len(prompts)
        assert [tuple(c.tokens) for c in out] == list(expected)
        # Held with its heartbeat beating: a request 5.5 s into the stall is still routed.
        started = _stall(trigger, STALL_S, beat=False)
        time.sleep(STALL_S - 0.5)
        late = asyncio.run(run_batch(url, str(model_dir), indexed[:1], max_tokens))
        ended = Path(f"{trigger}.ended")
        assert ended.exists()
        assert float(ended.read_text()) - started >= STALL_S - 0.1
        assert [c.error for c in late] == [None]
        assert tuple(late[0].tokens) == expected[0]
        sources, held_prefill, held_decode = _decode_metrics(ports)
        assert_prompt_kv_over_the_wire(sources, sum(map(len, prompts)) + len(prompts[0]))
        assert held_prefill == 0
        assert held_decode == 0
        # The control: held with its heartbeat frozen, past the router's cutoff (with slack
        # for its own check period on a loaded machine) the engine is gone, and a request is
        # refused at once while the engine is still held.
        ended.unlink()
        _stall(trigger, FROZEN_STALL_S, beat=True)
        time.sleep(FROZEN_CHECK_S)
        refused = asyncio.run(run_batch(url, str(model_dir), indexed[:1], max_tokens))
        assert not ended.exists(), "the control's stall ended before its request was sent"
        assert refused[0].error is not None
        assert "503" in refused[0].error, refused[0].error
    finally:
        for process in (*engines, router):
            process.stop()


def _stall(trigger: Path, seconds: int, *, beat: bool) -> float:
    """Hold the prefill engine's interpreter for ``seconds`` (``beat``: its heartbeat frozen
    too); when the stall started, once it has."""
    started = Path(f"{trigger}.started")
    started.unlink(missing_ok=True)
    staging = trigger.with_name(f".{trigger.name}.tmp")
    staging.write_text(f"{seconds} {int(beat)}")
    os.replace(staging, trigger)  # the engine never reads a half-written file
    deadline = time.monotonic() + 10.0
    while not started.exists():
        assert time.monotonic() < deadline, "the prefill engine never stalled"
        time.sleep(0.05)
    return float(started.read_text())
