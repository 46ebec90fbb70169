"""``moriio bench --e2e``: NIXL proxy request shaping, figures, table, settings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from moriio_tools.serve.e2e import E2EConfig, case_prompts, sessions_cpu_s
from moriio_tools.serve.e2e_report import (
    BASELINE,
    CASES,
    PREFILL_ALONE,
    Run,
    aggregate,
    render_table,
    render_verdicts,
    verdicts,
    with_prefill_limit,
)
from moriio_tools.serve.nixl_deployment import nixl_engine_env, nixl_transfer_config
from moriio_tools.serve.nixl_proxy import NixlProxy, nixl_decode_body, nixl_prefill_body
from support.peer_proxies import post_through

CLIENT = {
    "model": "m",
    "prompt": [11, 12, 13],
    "max_tokens": 16,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_the_prefill_leg_asks_for_one_token_and_a_remote_decode() -> None:
    body = nixl_prefill_body(CLIENT)
    assert body["max_tokens"] == 1
    assert body["stream"] is False
    assert "stream_options" not in body
    assert body["prompt"] == [11, 12, 13]
    params = body["kv_transfer_params"]
    assert params["do_remote_decode"] is True
    assert params["do_remote_prefill"] is False
    assert CLIENT["max_tokens"] == 16  # the client's request is not modified


def test_the_decode_leg_carries_what_the_prefill_returned() -> None:
    returned = {"do_remote_prefill": True, "remote_block_ids": [[3, 4]], "remote_port": 5600}
    body = nixl_decode_body(CLIENT, returned)
    assert body["kv_transfer_params"] == returned
    assert body["max_tokens"] == 16
    assert body["stream"] is True


def _serve_fakes() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """A prefill answering with kv_transfer_params and a decode echoing what it got."""
    prefill_seen: list[dict[str, Any]] = []
    decode_seen: list[dict[str, Any]] = []

    async def prefill(request: web.Request) -> web.Response:
        prefill_seen.append({"body": await request.json(), "rid": request.headers["X-Request-Id"]})
        return web.json_response({"kv_transfer_params": {"remote_block_ids": [[7]]}})

    async def decode(request: web.Request) -> web.Response:
        decode_seen.append({"body": await request.json(), "rid": request.headers["X-Request-Id"]})
        return web.Response(text="data: done\n\n")

    return prefill_seen, decode_seen, (prefill, decode)


def test_the_proxy_sends_the_prefill_answer_to_the_decode() -> None:
    prefill_seen, decode_seen, (prefill, decode) = _serve_fakes()

    def proxy(prefill_url: str, decode_url: str) -> NixlProxy:
        return NixlProxy([prefill_url], [decode_url])

    status, text = asyncio.run(post_through(proxy, prefill, decode, CLIENT))
    assert (status, text) == (200, "data: done\n\n")
    assert prefill_seen[0]["body"]["max_tokens"] == 1
    assert prefill_seen[0]["body"]["kv_transfer_params"]["do_remote_decode"] is True
    assert decode_seen[0]["body"]["kv_transfer_params"] == {"remote_block_ids": [[7]]}
    assert decode_seen[0]["body"]["max_tokens"] == 16
    assert prefill_seen[0]["rid"] == decode_seen[0]["rid"]


def test_the_proxy_needs_engines() -> None:
    with pytest.raises(ValueError, match="prefill and one decode"):
        NixlProxy([], ["http://127.0.0.1:1"])


def _run(connector: str, case: str, wall: float, ttft: list[float], **kw: Any) -> Run:
    return Run(
        connector=connector,
        case=case,
        round=kw.get("round", 0),
        requests=len(ttft),
        equal=kw.get("equal", len(ttft)),
        failures=0,
        wall_s=wall,
        cpu_s=kw.get("cpu"),
        ttft_s=ttft,
        itl_s=kw.get("itl", []),
        engine_itl_s=kw.get("engine_itl"),
    )


def test_aggregate_pools_rounds() -> None:
    runs = [
        _run("moriio-read-async", "short-1", 1.0, [0.010, 0.020], cpu=0.2, itl=[0.001]),
        _run("moriio-read-async", "short-1", 0.5, [0.030, 0.040], cpu=0.6, round=1),
        _run("moriio-read-async", "short-1", 0.25, [0.050, 0.060], equal=1, round=2),
    ]
    (row,) = aggregate(runs)
    assert row["requests"] == 6
    assert row["equal"] == 5
    assert row["requests_per_s_rounds"] == [2.0, 4.0, 4.0]  # the wrong output does not count
    assert row["requests_per_s"] == 4.0
    assert row["ttft_ms_p50"] == 40.0
    assert row["ttft_ms_p99"] == 60.0
    assert row["itl_ms_p50"] == 1.0
    assert row["engine_cpu_ms_per_request"] == 200.0  # 0.8 s over the 4 measured requests
    assert row["engine_itl_ms_p50"] is None  # no round scraped the engines


def test_the_engines_own_itl_is_the_median_over_rounds() -> None:
    runs = [
        _run("moriio-write", "short-1", 1.0, [0.01], engine_itl=0.004),
        _run("moriio-write", "short-1", 1.0, [0.01], engine_itl=0.006, round=1),
        _run("moriio-write", "short-1", 1.0, [0.01], engine_itl=0.009, round=2),
    ]
    (row,) = aggregate(runs)
    assert row["engine_itl_ms_p50"] == 6.0
    assert "engine ITL p50" in render_table([row])


def test_failed_requests_are_not_throughput() -> None:
    fast_failures = _run("nixl-progress-off", "long-4", 0.05, [0.01] * 8, equal=0)
    served = _run("moriio-read-async", "long-4", 1.0, [0.2] * 8)
    rows = aggregate([served, fast_failures])
    assert [r["requests_per_s"] for r in rows] == [8.0, 0.0]
    (verdict,) = verdicts(rows)
    assert verdict["requests_per_s"]["moriio_wins"] is True


def test_verdicts_compare_each_side_best() -> None:
    runs = [
        _run("moriio-read-async", "short-4", 1.0, [0.02] * 4),
        _run("moriio-write", "short-4", 0.5, [0.05] * 4),
        _run("nixl-default", "short-4", 2.0, [0.03] * 4),
        _run("nixl-progress-off", "short-4", 0.4, [0.01] * 4),
    ]
    (verdict,) = verdicts(aggregate(runs))
    rate = verdict["requests_per_s"]
    assert rate["moriio"] == {"connector": "moriio-write", "requests_per_s": 8.0}
    assert rate["nixl"] == {"connector": "nixl-progress-off", "requests_per_s": 10.0}
    assert rate["moriio_wins"] is False
    ttft = verdict["ttft_ms_p50"]
    assert ttft["moriio"]["connector"] == "moriio-read-async"
    assert ttft["moriio_wins"] is False


def test_moriio_wins_only_when_ahead_of_every_peer() -> None:
    runs = [
        _run("moriio-write", "short-1", 1.0, [0.05] * 4),
        _run("nixl-default", "short-1", 2.0, [0.09] * 4),
        _run("mooncake", "short-1", 4.0, [0.04] * 4),
    ]
    (verdict,) = verdicts(aggregate(runs))
    rate, ttft = verdict["requests_per_s"], verdict["ttft_ms_p50"]
    assert rate["mooncake"] == {"connector": "mooncake", "requests_per_s": 1.0}
    assert rate["moriio_wins"] is True  # 4 req/s: ahead of nixl's 2 and mooncake's 1
    assert ttft["moriio_wins"] is False  # mooncake's 40 ms beats moriio's 50 ms
    text = render_verdicts([verdict])
    assert "mooncake ahead" in text
    assert "vs 90.0 (nixl-default): moriio ahead" in text


def test_the_table_lists_every_row() -> None:
    rows = aggregate([_run("nixl-default", "long-4", 2.0, [0.1] * 4, equal=3)])
    text = render_table(rows)
    assert "nixl-default" in text
    assert "3/4" in text
    assert json.loads(json.dumps(rows)) == rows


def test_case_prompts_are_distinct_and_sized() -> None:
    short, long = case_prompts(CASES[0], 8, seed=1), case_prompts(CASES[2], 3, seed=1)
    assert len(set(short)) == 8
    assert all(33 <= len(p) <= 200 for p in short)
    assert [len(p) for p in long] == [1000] * 3
    assert case_prompts(CASES[0], 8, seed=1) == short
    assert not set(case_prompts(CASES[1], 8, seed=1)) & set(short)


def test_the_mixed_case_has_its_own_count_and_lengths() -> None:
    mixed = next(c for c in CASES if c.name == "mixed-128")
    prompts = case_prompts(mixed, 8, seed=1)
    assert len(prompts) == 256
    assert len(set(prompts)) == 256
    assert min(map(len, prompts)) >= 20
    assert max(map(len, prompts)) <= 600
    assert max(map(len, prompts)) > 200  # longer than the short cases' range


def _rated_run(connector: str, case: str, equal: int, wall_s: float) -> Run:
    return Run(connector, case, 0, equal, equal, 0, wall_s, None, [0.01], [])


def test_pd_rows_are_rated_against_the_prefill_alone_limit_of_their_case() -> None:
    rows = with_prefill_limit(
        aggregate(
            [
                _rated_run(BASELINE, "short-4", 8, 1.0),
                _rated_run(PREFILL_ALONE, "short-4", 8, 2.0),  # 4 req/s
                _rated_run(PREFILL_ALONE, "long-4", 4, 1.0),  # 4 req/s
                _rated_run("moriio-write", "short-4", 6, 2.0),  # 3 req/s
                _rated_run("moriio-write", "long-4", 2, 1.0),  # 2 req/s
                _rated_run("nixl-default", "short-1", 2, 1.0),  # no limit measured for short-1
            ]
        )
    )
    ratios = {(r["connector"], r["case"]): r["vs_prefill_alone"] for r in rows}
    assert ratios == {
        (BASELINE, "short-4"): None,
        (PREFILL_ALONE, "short-4"): None,
        (PREFILL_ALONE, "long-4"): None,
        ("moriio-write", "short-4"): 0.75,
        ("moriio-write", "long-4"): 0.5,
        ("nixl-default", "short-1"): None,
    }
    assert "x prefill-alone" in render_table(rows)


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="connector must be one of"):
        E2EConfig(connectors=("nixl",)).validate()
    with pytest.raises(ValueError, match="case must be one of"):
        E2EConfig(cases=("short-8",)).validate()
    with pytest.raises(ValueError, match="rounds"):
        E2EConfig(rounds=0).validate()


def test_nixl_engines_are_configured_for_a_shared_host(tmp_path: Path) -> None:
    config = nixl_transfer_config()
    assert config["kv_connector"] == "NixlConnector"
    assert config["kv_role"] == "kv_both"
    # vLLM's defaults: the progress thread is turned off in the environment alone
    assert config["kv_connector_extra_config"] == {"backends": ["UCX"]}
    env = nixl_engine_env(tmp_path, 5601, progress_thread=False)
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["MORIIO_NIXL_PROGRESS_THREAD"] == "0"


def test_session_cpu_sums_the_sessions_processes(tmp_path: Path) -> None:
    lines = {
        "100": "100 (api server) S 1 100 100 0 -1 0 0 0 0 0 300 100 0 0 20 0 1 0",
        "101": "101 (Engine) Core) R 100 100 100 0 -1 0 0 0 0 0 50 50 0 0 20 0 1 0",
        "200": "200 (other) S 1 200 200 0 -1 0 0 0 0 0 999 999 0 0 20 0 1 0",
    }
    for pid, text in lines.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(text + "\n")
    (tmp_path / "self").mkdir()
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    assert sessions_cpu_s([100], proc=tmp_path) == pytest.approx(500 / ticks)
