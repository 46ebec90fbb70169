"""The demo's configuration: model choice, per-model and per-role ``vllm serve`` flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from moriio_tools.cli.demo import add_arguments, config_from
from moriio_tools.models import MODEL_NAMES, zoo_model
from moriio_tools.serve.deployment import Deployment, EngineSlot
from moriio_tools.serve.runner import SOLO_GAP_S, ServeDemoConfig


def test_the_default_model_is_the_llama_with_the_demo_flags_unchanged() -> None:
    config = ServeDemoConfig()
    assert config.model == "llama"
    assert config.all_engine_args() == ()
    assert config.burst_gap_s == 0.0


def test_a_model_brings_its_own_flags_and_the_callers_flags_come_after() -> None:
    config = ServeDemoConfig(model="deepseek-v2", engine_args=("--block-size", "32"))
    assert config.all_engine_args() == ("--block-size", "16", "--block-size", "32")
    assert ServeDemoConfig(model="qwen3").all_engine_args() == ()


def test_a_batch_dependent_model_gets_its_requests_one_at_a_time() -> None:
    assert ServeDemoConfig(model="deepseek-v2").burst_gap_s == SOLO_GAP_S
    assert ServeDemoConfig(model="gemma2").burst_gap_s == 0.0


def test_only_mla_and_recurrent_state_are_checked_against_vllms_nixl_connector() -> None:
    own = [name for name in MODEL_NAMES if not zoo_model(name).single_engine_reference]
    assert own == ["deepseek-v2", "qwen3-next"]
    assert [name for name in MODEL_NAMES if zoo_model(name).recurrent_state] == ["qwen3-next"]


def test_an_unknown_model_fails_validation() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        ServeDemoConfig(model="gpt-2").validate()
    ServeDemoConfig(model="gemma2").validate()


def test_the_demo_command_passes_the_model_on() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from(parser.parse_args(["--model", "qwen3"])).model == "qwen3"
    # a passing demo's engines stop on their own, without vLLM's EngineDeadError traceback
    assert config_from(parser.parse_args([])).all_engine_args()[-2:] == ("--shutdown-timeout", "1")
    assert config_from(parser.parse_args([])).model == "llama"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "gpt-2"])


def test_prefill_and_decode_engines_get_their_own_flags_after_the_common_ones() -> None:
    deployment = Deployment(
        Path("/nonexistent"),
        "read",
        Path("/nonexistent"),
        engine_args=("--max-model-len", "512"),
        prefill_engine_args=("--kv-cache-dtype", "fp8_e4m3"),
        decode_engine_args=("--kv-cache-dtype", "fp8_e5m2"),
    )
    prefill = EngineSlot("prefill", 0, 1, 2, 3)
    decode = EngineSlot("decode", 0, 4, 5, 6)
    assert deployment.args_of(prefill) == ("--max-model-len", "512", "--kv-cache-dtype", "fp8_e4m3")
    assert deployment.args_of(decode) == ("--max-model-len", "512", "--kv-cache-dtype", "fp8_e5m2")
    assert Deployment(Path("/m"), "write", Path("/l")).args_of(decode) == ()
