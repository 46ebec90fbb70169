"""Reading an engine's /metrics: held blocks and histogram quantiles."""

from __future__ import annotations

import pytest

from moriio_tools.serve.metrics import (
    held_blocks,
    histogram_quantile,
    parse,
    prompt_tokens_by_source,
    since,
    total,
)

TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0006103515625
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="8193"} 1.0
vllm:moriio_bytes_total{engine="0",model_name="m"} 6.5536e+06
vllm:moriio_load_time_seconds_bucket{engine="0",le="0.01",model_name="m"} 2.0
vllm:moriio_load_time_seconds_bucket{engine="0",le="0.1",model_name="m"} 6.0
vllm:moriio_load_time_seconds_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:moriio_load_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:moriio_load_time_seconds_count{engine="0",model_name="m"} 10.0
"""


def test_held_blocks_from_usage_and_block_count() -> None:
    samples = parse(TEXT)
    assert held_blocks(samples) == 5  # 0.00061 x (8193 - 1): the null block is not counted
    idle = parse(TEXT.replace("0.0006103515625", "0.0"))
    assert held_blocks(idle) == 0


def test_totals_and_labels() -> None:
    samples = parse(TEXT)
    assert total(samples, "vllm:moriio_bytes_total") == 6553600
    info = [s for s in samples if s.name == "vllm:cache_config_info"]
    assert info[0].labels["num_gpu_blocks"] == "8193"


def test_histogram_quantiles_interpolate_inside_the_bucket() -> None:
    samples = parse(TEXT)
    name = "vllm:moriio_load_time_seconds"
    assert histogram_quantile(samples, name, 0.1) == pytest.approx(0.005)
    assert histogram_quantile(samples, name, 0.5) == pytest.approx(0.0775)
    assert histogram_quantile(samples, name, 0.99) == pytest.approx(0.9775)
    assert histogram_quantile(samples, "vllm:absent", 0.5) is None
    empty = parse(TEXT.replace(" 10.0", " 0.0").replace(" 6.0", " 0.0").replace(" 2.0", " 0.0"))
    assert histogram_quantile(empty, name, 0.5) is None


def test_since_gives_what_a_phase_added() -> None:
    earlier = parse(TEXT)
    later = parse(TEXT.replace('le="1.0",model_name="m"} 10.0', 'le="1.0",model_name="m"} 14.0'))
    later = [
        s if "+Inf" not in s.labels.get("le", "") else type(s)(s.name, s.labels, 14.0)
        for s in later
    ]
    gained = since(later, earlier)
    name = "vllm:moriio_load_time_seconds"
    assert total([s for s in gained if s.labels.get("le") == "+Inf"], f"{name}_bucket") == 4
    # the four new loads all fell in (0.1, 1.0]
    assert histogram_quantile(gained, name, 0.5) == pytest.approx(0.55)


SOURCES = """\
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 1.0
vllm:prompt_tokens_by_source_created{engine="0",model_name="m",source="local_compute"} 1.7e+09
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 32.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 961.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="elsewhere"} 5.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 994.0
"""


def test_prompt_tokens_are_counted_per_source_over_every_engine() -> None:
    two_engines = parse(SOURCES) + parse(SOURCES.replace('engine="0"', 'engine="1"'))
    assert prompt_tokens_by_source(two_engines) == {
        "external_kv_transfer": 1922,
        "local_compute": 2,
        "local_cache_hit": 64,
    }
    assert prompt_tokens_by_source([]) == dict.fromkeys(
        ("external_kv_transfer", "local_compute", "local_cache_hit"), 0
    )
