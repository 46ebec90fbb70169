"""The soak's pure parts: durations, least-squares slopes, and the verdict from records."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from moriio_tools.cli import bench
from moriio_tools.cli.bench_soak import config_from
from moriio_tools.prompts import build_prompts
from moriio_tools.soak.config import SoakConfig, parse_duration
from moriio_tools.soak.probes import session_usage
from moriio_tools.soak.records import EngineSample, Interval, Kill
from moriio_tools.soak.runner import run_soak
from moriio_tools.soak.verdict import (
    FDS_SLOPE_MAX_PER_H,
    RSS_SLOPE_MAX_MIB_PER_H,
    slope_per_hour,
    slopes,
    verdict,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600.0), ("600s", 600.0), ("10m", 600.0), ("1h", 3600.0), ("1h30m", 5400.0)],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(f" {text.upper()} ") == seconds


@pytest.mark.parametrize("text", ["", "ten", "10x", "-5m", "0", "0s", "1h30", "5m5m", "m"])
def test_a_malformed_or_empty_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_the_command_line_turns_into_a_soak_config() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--soak", "10m", "--soak-kill-every", "90s", "--soak-interval", "30"])
    config = config_from(args)
    assert (config.duration_s, config.kill_every_s, config.interval_s) == (600.0, 90.0, 30.0)
    assert config.burst == 128
    assert config.mode_s == 300.0
    assert (
        config_from(parser.parse_args(["--soak", "1h", "--soak-kill-every", "0"])).kill_every_s == 0
    )
    assert parser.parse_args([]).soak is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--soak", "10 minutes"])


def test_a_config_out_of_range_is_refused() -> None:
    SoakConfig(duration_s=60).validate()
    with pytest.raises(ValueError, match="mode"):
        SoakConfig(duration_s=60, modes=("push",)).validate()
    with pytest.raises(ValueError, match="burst"):
        SoakConfig(duration_s=60, burst=0).validate()
    with pytest.raises(ValueError, match="1024"):
        SoakConfig(duration_s=60, cancel_prompt_len=1000).validate()


def test_a_reference_that_lacks_a_pool_prompt_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    config = SoakConfig(duration_s=60, pool=4, log_dir=str(tmp_path))
    pool = build_prompts(config.pool, seed=config.seed)
    partial = {prompt: (1, 2) for prompt in pool if prompt != pool[0]}
    lacking = pool.count(pool[0])  # a pool may send a prompt more than once
    with pytest.raises(ValueError, match=f"lacks {lacking} of the pool's 4 prompts"):
        run_soak(config, lambda _: None, reference=partial)
    assert list(tmp_path.iterdir()) == []  # no model prepared, no engine started


def test_the_slope_of_a_line_is_exact_and_per_hour() -> None:
    times = [0.0, 60.0, 120.0, 180.0]
    assert slope_per_hour(times, [100.0, 101.0, 102.0, 103.0]) == pytest.approx(60.0)
    assert slope_per_hour(times, [5.0, 5.0, 5.0, 5.0]) == 0.0
    # Least squares: +-2 of noise over three minutes weighs -24/h.
    assert slope_per_hour(times, [10.0, 12.0, 8.0, 10.0]) == pytest.approx(-24.0)
    assert slope_per_hour([0.0], [1.0]) is None
    assert slope_per_hour([5.0, 5.0], [1.0, 2.0]) is None
    with pytest.raises(ValueError, match="length"):
        slope_per_hour([0.0, 1.0], [1.0])


def engine(
    name: str,
    t: float,
    rss: float = 2000.0,
    fds: int = 100,
    held: int = 0,
    inc: int = 0,
    born: float = 0.0,
) -> EngineSample:
    """``name`` at soak time ``t``, in the incarnation that started at ``born``."""
    return EngineSample(name, inc, t - born, held, 0, rss, fds, 3, {"handshakes": 1})


def interval(
    index: int, t: float, *engines: EngineSample, answered: int = 10, kill_errors: int = 0
) -> Interval:
    """Ten requests sent, ``answered`` of them equal, the rest failed in a kill."""
    return Interval(
        index,
        "read",
        t,
        sent=10,
        answered=answered,
        equal=answered,
        errors=0,
        kill_errors=kill_errors,
        cancelled=2,
        quiet_s=6.0,
        engines=engines,
    )


def steady(count: int = 6, step_s: float = 60.0) -> list[Interval]:
    """Flat RSS and descriptors: a few MiB and descriptors of noise around a level."""
    noise = [0.0, 3.0, -2.0, 1.0, -3.0, 2.0, 0.0, -1.0]
    out = []
    for i in range(count):
        t, wobble = (i + 1) * step_s, noise[i % 8]
        prefill = engine("prefill0", t, 2000.0 + wobble, 100 + int(wobble))
        out.append(interval(i + 1, t, prefill, engine("decode0", t, 2500.0 - wobble, 120)))
    return out


def test_a_steady_soak_passes_with_flat_judged_slopes() -> None:
    records = steady()
    assert verdict(records, []) == []
    found = slopes(records)
    # The first WARMUP_S (the sample at 60 s) left out.
    assert [(s.engine, s.samples, s.span_s, s.judged) for s in found] == [
        ("prefill0", 5, 240.0, True),
        ("decode0", 5, 240.0, True),
    ]
    assert all(abs(s.rss_mib_per_h or 0) < RSS_SLOPE_MAX_MIB_PER_H for s in found)


def test_an_answer_unequal_to_the_reference_fails() -> None:
    records = steady()
    records[2] = replace(records[2], equal=9)
    assert verdict(records, []) == ["interval 3 (read): 1 answers differ from the reference"]


def test_errors_fail_outside_a_kill_only() -> None:
    during = steady()
    during[1] = replace(during[1], answered=4, equal=4, kill_errors=6)
    assert verdict(during, []) == []
    outside = steady()
    outside[1] = replace(outside[1], answered=9, equal=9, errors=1, error_examples=("HTTP 503",))
    (failure,) = verdict(outside, [])
    assert "1 requests failed outside a kill: HTTP 503" in failure


def test_a_block_held_at_a_quiet_end_fails() -> None:
    records = steady()
    quiet_end = (engine("prefill0", 360.0), engine("decode0", 360.0, held=3))
    records[-1] = replace(records[-1], engines=quiet_end)
    failures = verdict(records, [])
    assert "interval 6 (read): blocks held at the quiet end {'decode0': 3}" in failures


def test_growing_rss_or_descriptors_fail_but_a_restart_starting_over_does_not() -> None:
    grow = [
        interval(i, i * 60.0, engine("prefill0", i * 60.0, 2000.0 + 100 * i, 100 + 2 * i))
        for i in range(1, 7)
    ]
    failures = verdict(grow, [])  # +6000 MiB/h and +120 fds/h on prefill0
    assert len(failures) == 2
    assert RSS_SLOPE_MAX_MIB_PER_H < 6000.0
    assert failures[0].startswith("read prefill0#0: RSS grows +6000.0MiB/h")
    assert failures[1].startswith("read prefill0#0: open fds grows +120.0/h")
    assert FDS_SLOPE_MAX_PER_H < 120.0
    # A restart: the new incarnation's RSS starts low; series per incarnation stay flat.
    restart = [
        interval(i, i * 60.0, engine("prefill0", i * 60.0, 3000.0))
        if i <= 4
        else interval(i, i * 60.0, engine("prefill0", i * 60.0, 1500.0, inc=1, born=250.0))
        for i in range(1, 10)
    ]
    assert verdict(restart, []) == []
    assert [(s.incarnation, s.samples, s.judged) for s in slopes(restart)] == [
        (0, 3, True),
        (1, 3, True),
    ]


def test_the_warm_up_of_an_incarnation_is_left_out_of_its_slope() -> None:
    rss = {30: 2000.0, 60: 2100.0, 90: 2200.0, 120: 2250.0, 180: 2250.0, 240: 2250.0}
    records = [interval(n, t, engine("decode0", t, r)) for n, (t, r) in enumerate(rss.items())]
    (slope,) = slopes(records)
    assert (slope.samples, slope.rss_mib_per_h, slope.judged) == (3, 0.0, True)
    assert verdict(records, []) == []


def test_a_short_series_is_reported_but_not_judged() -> None:
    records = [
        interval(i, i * 60.0, engine("decode0", i * 60.0, 2000.0 + 500 * i)) for i in (1, 2, 3)
    ]
    (slope,) = slopes(records)
    assert (slope.samples, slope.judged) == (2, False)
    assert slope.rss_mib_per_h == pytest.approx(30000.0)
    assert verdict(records, []) == []


def test_a_restart_whose_requests_were_not_all_answered_equal_fails() -> None:
    kill = Kill("write", "decode0", "decode", 180.0, 128, 100, 28, 40.0, 16, 16, 1600, LOADED)
    assert verdict(steady(), [kill]) == []
    (failure,) = verdict(steady(), [replace(kill, recovery_equal=15)])
    assert "only 15 of 16 requests after it answered equal" in failure


LOADED = {"external_kv_transfer": 1500, "local_cache_hit": 100, "local_compute": 0}


@pytest.mark.parametrize(
    "sources",
    [
        {"external_kv_transfer": 0, "local_cache_hit": 0, "local_compute": 1600},  # recomputed
        {"external_kv_transfer": 1500, "local_cache_hit": 0, "local_compute": 100},
        {"external_kv_transfer": 1000, "local_cache_hit": 100, "local_compute": 0},  # uncounted
        {},  # nothing recorded
    ],
)
def test_a_restart_whose_prompts_the_decode_did_not_load_fails(sources: dict[str, int]) -> None:
    kill = Kill("read", "prefill0", "prefill", 180.0, 128, 128, 0, 40.0, 16, 16, 1600, LOADED)
    assert verdict(steady(), [kill]) == []
    (failure,) = verdict(steady(), [replace(kill, recovery_sources=sources)])
    assert "did not load the prompts after it over the wire" in failure


def test_session_usage_sums_rss_and_descriptors_over_the_session(tmp_path: Path) -> None:
    stats = {
        "100": "100 (api server) S 1 100 100 0",
        "101": "101 (Engine) Core) R 100 100 100 0",
        "200": "200 (other) S 1 200 200 0",
    }
    for pid, stat in stats.items():
        (tmp_path / pid / "fd").mkdir(parents=True)
        (tmp_path / pid / "stat").write_text(stat + "\n")
        (tmp_path / pid / "status").write_text(f"Name:\tx\nVmRSS:\t  {int(pid) * 1024} kB\n")
        for fd in range(int(pid) // 50):
            (tmp_path / pid / "fd" / str(fd)).touch()
    assert session_usage(100, proc=tmp_path) == (201.0, 4, 2)
