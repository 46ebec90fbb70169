"""Engine-free parts: the P/D harness's prompts, waves, spans and summary; the demo's CLI output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from moriio_tools.harness import (
    SPECIAL_LENGTHS,
    EngineSnapshot,
    SpanRecorder,
    TinyLlama,
    TransferSpan,
    build_prompts,
    busy_seconds,
    demo_command,
    demo_summary_module,
    ephemeral_floor,
    free_ports,
    percentile,
)
from support.pd.process_proxy import RouteResult
from support.pd.runner import PDRunConfig, plan_waves, summarize

# -- prompts and waves --------------------------------------------------------------------


def test_default_prompts_cover_special_lengths_and_repeats() -> None:
    prompts = build_prompts(16)
    lengths = [len(p) for p in prompts]
    assert lengths[:4] == list(SPECIAL_LENGTHS)
    assert all(33 <= n <= 200 for n in lengths)
    assert prompts[-1] == prompts[0]  # 64 tokens: one block left to move
    assert prompts[-2] == prompts[3]  # 65 tokens: nothing left to move
    assert len(set(prompts)) == 14
    assert build_prompts(16) == prompts  # deterministic
    assert build_prompts(16, seed=1) != prompts


def test_fixed_length_prompts_repeat_only_the_first() -> None:
    prompts = build_prompts(5, 40)
    assert {len(p) for p in prompts} == {40}
    assert prompts[-1] == prompts[0]
    assert len(set(prompts)) == 4
    assert build_prompts(1) == build_prompts(1)
    assert len(build_prompts(1)) == 1


@pytest.mark.parametrize(("requests", "prompt_len"), [(0, None), (3, 0)])
def test_prompts_reject_bad_sizes(requests: int, prompt_len: int | None) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        build_prompts(requests, prompt_len)


def test_waves_respect_concurrency_and_split_repeats() -> None:
    prompts = build_prompts(10)
    waves = plan_waves(prompts, 4)
    assert [i for wave in waves for i in wave] == list(range(10))
    assert all(len(w) <= 4 for w in waves)
    for wave in waves:
        assert len({prompts[i] for i in wave}) == len(wave)
    # a repeat never shares a wave with its first occurrence, even when all would fit
    big = plan_waves(prompts, 64)
    assert len(big) == 2
    assert big[1][0] == 8  # the first repeat starts the second wave
    with pytest.raises(ValueError, match="concurrency"):
        plan_waves(prompts, 0)


# -- transfer spans ------------------------------------------------------------------------


def _result(tid: str, elapsed: float, nbytes: int, ok: bool = True) -> Any:
    request = SimpleNamespace(transfer_id=tid, plan=SimpleNamespace(total_bytes=nbytes))
    return SimpleNamespace(request=request, ok=ok, elapsed=elapsed, message="", retries=0)


def test_span_recorder_joins_the_batches_of_a_transfer() -> None:
    clock = SimpleNamespace(now=lambda: 10.0)
    recorder = SpanRecorder(clock)  # type: ignore[arg-type]
    recorder.observe([_result("a", 0.5, 100), _result("b", 0.1, 7)])
    recorder.record([_result("a", 0.2, 100), _result("b", 0.0, 7, ok=False)], 11.0)
    spans = {s.transfer_id: s for s in recorder.spans()}
    assert spans["a"] == TransferSpan("a", 9.5, 11.0, 200, 2, True)
    assert spans["b"] == TransferSpan("b", 9.9, 11.0, 7, 2, False)


def test_percentile_and_busy_time() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)
    spans = [
        TransferSpan("a", 0.0, 2.0, 1, 1, True),
        TransferSpan("b", 1.0, 3.0, 1, 1, True),
        TransferSpan("c", 5.0, 6.0, 1, 1, True),
    ]
    assert busy_seconds(spans) == pytest.approx(4.0)
    assert busy_seconds([]) == 0.0


# -- summary --------------------------------------------------------------------------------


def _snapshot(name: str, *, free: int, spans: tuple[TransferSpan, ...] = (), **counters: int):
    return EngineSnapshot(
        name=name,
        free_blocks=free,
        usable_blocks=100,
        scheduler_requests=0,
        counters=dict(counters),
        failures_by_kind={},
        transfers=spans,
        settled=True,
    )


def test_summary_counts_mismatches_failures_and_held_blocks(tmp_path: Path) -> None:
    prompts = [(1, 2, 3), (4, 5, 6), (1, 2, 3)]
    baseline = {(1, 2, 3): (7, 8), (4, 5, 6): (9, 9)}
    results = [
        RouteResult("r0", "t0", prefill_tokens=(7,), decode_tokens=(7, 8)),
        RouteResult("r1", "t1", prefill_tokens=(9,), decode_tokens=(9, 1)),
        RouteResult("r2", "t2", error="no decode output"),
    ]
    spans = (
        TransferSpan("t0", 0.0, 0.002, 4000, 4, True),
        TransferSpan("t1", 1, 1.001, 0, 4, True),
    )
    summary = summarize(
        PDRunConfig(mode="read", requests=3),
        prompts=prompts,
        baseline=baseline,
        results=results,
        snapshots=(
            _snapshot("prefill", free=100),
            _snapshot("decode", free=98, spans=spans, bytes_moved=4000, transfers_failed=1),
        ),
        timings={"startup_s": 1.0, "pd_s": 2.0, "wall_s": 4.0},
        waves=2,
        log_dir=tmp_path,
    )
    assert summary["completed"] == 2
    assert summary["mismatches"] == 1
    assert summary["mismatched_tokens"] == 1
    assert summary["failures"] == 2  # one routing error, one failed transfer
    assert summary["held_blocks_prefill"] == 0
    assert summary["held_blocks_decode"] == 2
    assert summary["kv_bytes"] == 4000
    assert summary["transfer_latency_ms_p50"] == pytest.approx(1.0)
    assert summary["transfer_latency_ms_p99"] == pytest.approx(2.0)
    assert summary["transfer_gbps"] == pytest.approx(4000 / 0.003 / 1e9, rel=1e-3)
    assert summary["prompt_tokens"] == 9
    assert summary["ok"] is False


def test_pd_run_config_validation() -> None:
    PDRunConfig(mode="write", prompt_len=1008).validate()
    for bad in (
        PDRunConfig(mode="push"),
        PDRunConfig(requests=0),
        PDRunConfig(concurrency=0),
        PDRunConfig(prompt_len=1009),
    ):
        with pytest.raises(ValueError, match=r"mode|requests|concurrency|prompt_len"):
            bad.validate()


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    """A restarted engine must get its ports back: none may be a peer's source port."""
    ports = free_ports(4)
    assert len(set(ports)) == 4
    floor = ephemeral_floor()
    assert all(10_000 <= p < floor for p in ports)


def test_model_directory_name_follows_the_shape() -> None:
    spec = TinyLlama()
    assert spec.head_dim == 64
    assert spec.dirname != TinyLlama(seed=1).dirname
    names = [name for name, _ in spec.tensor_shapes()]
    assert len(names) == len(set(names)) == 2 + 9 * spec.num_hidden_layers + 1


# -- command line ---------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_command.add_arguments(parser)
    return parser.parse_args(argv)


def test_demo_arguments_and_defaults() -> None:
    args = _parse()
    assert (args.mode, args.requests, args.prompt_len, args.json) == ("both", 16, None, False)
    assert (args.idle_requests, args.idle_gap, args.prefill, args.decode) == (4, 3.0, 1, 1)
    args = _parse("--mode", "write", "--requests", "3", "--prompt-len", "40", "--json")
    assert (args.mode, args.requests, args.prompt_len, args.json) == ("write", 3, 40, True)
    config = demo_command.config_from(
        _parse("--prefill", "2", "--decode", "2", "--idle-requests", "0")
    )
    assert (config.modes, config.prefill, config.decode) == (("read", "write"), 2, 2)
    assert config.idle_requests == 0
    for bad in (("--requests", "0"), ("--idle-requests", "-1"), ("--prefill", "0")):
        with pytest.raises(SystemExit):
            _parse(*bad)


def _summary(mode: str, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "mode": mode,
        "requests": 4,
        "completed": 4,
        "mismatches": 0,
        "failures": 0,
        "held_blocks_prefill": 0,
        "held_blocks_decode": 0,
        "kv_bytes": 1 << 20,
        "prompt_tokens": 300,
        "prompt_tokens_external": 268,
        "prompt_tokens_local": 0,
        "prompt_tokens_local_cache_hit": 32,
        "transfer_gbps": 1.5,
        "transfer_latency_ms_p50": 0.5,
        "transfer_latency_ms_p99": 2.0,
        "ttft_ms_p50": 40.0,
        "ttft_ms_p99": 90.0,
        "itl_ms_p50": 12.0,
        "idle_ttft_ms_p50": 35.0,
        "concurrent_ttft_ms_p50": 80.0,
        "engines": "1P1D",
        "loads": 4,
        "expired_leases": 0,
        "startup_s": 20.0,
        "pd_s": 1.0,
        "wall_s": 25.0,
        "log_dir": "/tmp/x",
        "ok": True,
    }
    s.update(over)
    return s


def test_combined_summary_sums_counts_and_keeps_the_worst_figures() -> None:
    out = demo_summary_module.combine(
        [_summary("read"), _summary("write", transfer_gbps=0.5, mismatches=1)]
    )
    assert out["mode"] == "read+write"
    assert out["requests"] == 8
    assert out["mismatches"] == 1
    assert out["transfer_gbps"] == 0.5
    assert out["transfer_latency_ms_p99"] == 2.0
    assert set(out["runs"]) == {"read", "write"}


def test_rendered_table_shows_every_stable_figure() -> None:
    text = demo_summary_module.render([_summary("read"), _summary("write", ok=False, mismatches=2)])
    for label in ("decode mismatches", "KV bytes moved", "1 MiB", "1.5 GB/s", "blocks held"):
        assert label in text
    assert "READ PASS" in text
    assert "WRITE FAIL" in text


def test_demo_exit_status_follows_the_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_command, "missing_requirements", lambda: None)
    outcomes = iter([True, False])
    monkeypatch.setattr(
        demo_command,
        "run_serve_demo",
        lambda config, progress: [_summary(m, ok=next(outcomes)) for m in config.modes],
    )
    assert demo_command.run(_parse("--mode", "read")) == 0
    assert demo_command.run(_parse("--mode", "write")) == demo_command.EXIT_FAILED
    monkeypatch.setattr(demo_command, "missing_requirements", lambda: "no engine here")
    assert demo_command.run(_parse()) == demo_command.EXIT_USAGE


def test_demo_json_prints_one_object(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo_command, "missing_requirements", lambda: None)
    monkeypatch.setattr(
        demo_command, "run_serve_demo", lambda config, progress: [_summary(m) for m in config.modes]
    )
    assert demo_command.run(_parse("--mode", "both", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "read+write"
    assert out["runs"]["write"]["mode"] == "write"
    for key in ("requests", "mismatches", "failures", "held_blocks_prefill", "transfer_gbps"):
        assert key in out
    for key in ("held_blocks_decode", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50"):
        assert key in out
