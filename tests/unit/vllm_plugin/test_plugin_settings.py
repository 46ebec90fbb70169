"""Connector settings: validated at start-up, errors name the key, in-tree env vars warned."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moriio.config.settings import (
    DEPRECATED_ENV_VARS,
    Backend,
    SettingsError,
    Transport,
    parse_settings,
)
from moriio.domain.values.modes import LoadMode, TransferMode
from moriio.testing.handoffs import PROMPT

BAD_VALUES = [
    ("read_mode", "sometimes"),
    ("transport", "carrier-pigeon"),
    ("backend", "ib"),
    ("host_ip", 5),
    ("handshake_port", 0),
    ("handshake_port", "http"),
    ("notify_port", 70000),
    ("qp_per_transfer", 0),
    ("post_batch_size", 0),
    ("num_workers", -1),
    ("num_workers", True),
    ("transfer_timeout", -1),
    ("transfer_timeout", "soon"),
    ("transfer_timeout", float("inf")),
    ("defer_timeout", 0),
    ("clock_skew_allowance", -0.5),
    ("clock_skew_allowance", float("inf")),
    ("clock_skew_allowance", float("nan")),
    ("clock_skew_allowance", 1e6),
    ("clock_skew_allowance", "a bit"),
    ("clock_skew_allowance", True),
    ("handshake_timeout", "never"),
    ("load_mode", "eager"),
    ("load_mode", 1),
    ("handshake_retry_after", 0),
    ("handshake_retry_after", "later"),
    ("handshake_max_retry_after", 1e9),
    ("handshake_max_retry_after", float("inf")),
    ("trusted_remote_hosts", 42),
    ("trusted_remote_hosts", ["10.0.0.1", 7]),
    ("shared_secret_env", 3),
    ("chaos_seed", "x"),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
def test_invalid_value_is_refused_naming_its_key(key: str, value: Any) -> None:
    with pytest.raises(SettingsError, match=key):
        parse_settings({key: value})


def test_both_secret_sources_are_refused() -> None:
    with pytest.raises(SettingsError, match="shared_secret_env and shared_secret_file"):
        parse_settings({"shared_secret_env": "A", "shared_secret_file": "/tmp/s"})


def test_values_from_json_strings_are_accepted() -> None:
    settings = parse_settings(
        {
            "read_mode": "true",
            "transport": "NIXL",
            "backend": "RDMA",
            "handshake_port": "7001",
            "notify_port": 7002,
            "transfer_timeout": "2.5",
            "defer_timeout": 4,
            "trusted_remote_hosts": "10.0.0.1, 10.0.0.2,*",
            "proxy_ip": "10.0.0.9",
            "proxy_ping_port": "36367",
            "http_port": 8100,
            "progress_interval": "0.002",
            "idle_step_wait": "0.02",
        }
    )
    assert settings.mode is TransferMode.READ
    assert settings.transport is Transport.NIXL
    assert settings.backend is Backend.RDMA
    assert (settings.handshake_port, settings.notify_port) == (7001, 7002)
    assert (settings.transfer_timeout, settings.defer_timeout) == (2.5, 4.0)
    assert settings.trusted_remote_hosts == ("10.0.0.1", "10.0.0.2")
    assert settings.trust_any_host
    assert (settings.proxy_ip, settings.proxy_ping_port, settings.http_port) == (
        "10.0.0.9",
        36367,
        8100,
    )
    assert settings.progress_interval == 0.002
    assert settings.idle_step_wait == 0.02
    assert parse_settings({"idle_step_wait": 0}).idle_step_wait == 0.0  # no wait


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"proxy_ip": "10.0.0.9"}, "proxy_ping_port"),
        ({"proxy_ping_port": 36367}, "proxy_ip"),
        ({"proxy_ip": "10.0.0.9", "proxy_ping_port": 36367}, "http_port"),
        ({"proxy_ping_port": 70000, "proxy_ip": "h", "http_port": 1}, "proxy_ping_port"),
        ({"progress_interval": 0}, "progress_interval"),
        ({"progress_interval": 5}, "progress_interval"),
        ({"idle_step_wait": -0.1}, "idle_step_wait"),
        ({"idle_step_wait": 2}, "idle_step_wait"),
        ({"idle_step_wait": False}, "idle_step_wait"),
        ({"proxy_ping_interval": -1}, "proxy_ping_interval"),
    ],
)
def test_router_registration_and_progress_keys_are_checked(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(extra)


def test_defaults() -> None:
    settings = parse_settings(None)
    assert settings.mode is TransferMode.WRITE
    assert settings.transfer_timeout == 30.0
    assert settings.defer_timeout == 60.0
    assert settings.trusted_remote_hosts == ()
    assert settings.proxy_ip is None
    assert settings.progress_interval == 0.001
    assert settings.idle_step_wait == 0.01
    assert not settings.trust_any_host


def test_unknown_keys_are_refused_all_named() -> None:
    with pytest.raises(SettingsError, match="unknown key aa_other; unknown key zz_typo"):
        parse_settings({"read_mode": True, "zz_typo": 1, "aa_other": 2})


# -- through the connector (needs vLLM) ------------------------------------------------------


@pytest.fixture
def moriio_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The plugin routes ``moriio`` records to vLLM's handlers, not to the root logger."""
    logger = logging.getLogger("moriio.vllm")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="moriio.vllm")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.vllm
def test_connector_refuses_bad_config_at_start_up_naming_the_key() -> None:
    pytest.importorskip("vllm")
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from moriio.vllm_plugin import MoriioKVConnector
    from moriio_tools.vllm_harness import make_kv_cache_config
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_consumer", {"read_mode": True, "defer_timeout": "later"})
    with pytest.raises(SettingsError, match="defer_timeout"):
        MoriioKVConnector(config, KVConnectorRole.SCHEDULER, make_kv_cache_config(16))


@pytest.mark.vllm
@pytest.mark.parametrize("env", sorted(DEPRECATED_ENV_VARS))
def test_in_tree_env_var_is_warned_about_and_ignored(
    env: str, monkeypatch: pytest.MonkeyPatch, moriio_log: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("vllm")
    from moriio.vllm_plugin.connector import load_settings
    from support.vllm_scheduler import make_vllm_config

    monkeypatch.setenv(env, "1")
    settings = load_settings(make_vllm_config("kv_consumer", {"transport": "nixl"}))
    assert settings.mode is TransferMode.WRITE  # VLLM_MORIIO_CONNECTOR_READ_MODE ignored
    assert settings.qp_per_transfer is None  # chosen for the NICs, not by the variable
    messages = [r.getMessage() for r in moriio_log.records if r.levelno == logging.WARNING]
    assert any(env in m and "deprecated" in m and DEPRECATED_ENV_VARS[env] in m for m in messages)


@pytest.mark.vllm
def test_unknown_extra_config_key_stops_the_connector() -> None:
    pytest.importorskip("vllm")
    from moriio.vllm_plugin.connector import load_settings
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_consumer", {"read_mode": True, "qp_per_transfr": 4})
    with pytest.raises(SettingsError, match=r"qp_per_transfr \(did you mean qp_per_transfer\?\)"):
        load_settings(config)


@pytest.mark.vllm
def test_no_warning_without_deprecated_env_vars(
    monkeypatch: pytest.MonkeyPatch, moriio_log: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("vllm")
    from moriio.vllm_plugin.connector import load_settings
    from support.vllm_scheduler import make_vllm_config

    for env in DEPRECATED_ENV_VARS:
        monkeypatch.delenv(env, raising=False)
    load_settings(make_vllm_config("kv_consumer", {"read_mode": True}))
    assert not any("deprecated" in r.getMessage() for r in moriio_log.records)


@pytest.mark.parametrize(
    ("extra", "keys"),
    [
        ({"transfer_timeout": 30, "defer_timeout": 20}, ("defer_timeout", "transfer_timeout")),
        ({"transfer_timeout": 30, "defer_timeout": 30}, ("defer_timeout", "transfer_timeout")),
        ({"defer_timeout": 10}, ("defer_timeout", "transfer_timeout")),
        (
            {"transfer_timeout": 30, "defer_timeout": 35, "clock_skew_allowance": 5},
            ("defer_timeout", "transfer_timeout", "clock_skew_allowance"),
        ),
        ({"handshake_port": 7000, "notify_port": "7000"}, ("handshake_port", "notify_port")),
        ({"load_mode": "layerwise"}, ("load_mode", "read_mode")),
        (
            {"handshake_retry_after": 60, "handshake_max_retry_after": 30},
            ("handshake_retry_after", "handshake_max_retry_after"),
        ),
    ],
)
def test_inconsistent_settings_are_refused_at_start_up_naming_the_keys(
    extra: dict[str, object], keys: tuple[str, ...]
) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(extra)
    for key in keys:
        assert key in str(info.value)


def test_the_clock_skew_allowance_defaults_to_one_second_and_reaches_the_policy() -> None:
    assert parse_settings({}).clock_skew_allowance == 1.0
    settings = parse_settings({"clock_skew_allowance": "0.25"})
    assert settings.clock_skew_allowance == 0.25
    assert settings.transfer_policy().clock_skew_allowance == 0.25
    assert parse_settings({"clock_skew_allowance": 0}).clock_skew_allowance == 0.0


def test_load_mode_defaults_to_async_and_layerwise_is_accepted_in_read_mode() -> None:
    assert parse_settings({}).load_mode is LoadMode.ASYNC
    settings = parse_settings({"read_mode": True, "load_mode": " Layerwise "})
    assert settings.load_mode is LoadMode.LAYERWISE
    settings = parse_settings({"handshake_retry_after": "2", "handshake_max_retry_after": 8})
    assert (settings.handshake_retry_after, settings.handshake_max_retry_after) == (2.0, 8.0)


TIMEOUTS = {
    "read_mode": True,
    "transfer_timeout": 2.5,
    "defer_timeout": 8,
    "clock_skew_allowance": 0.5,
    "quarantine_timeout": 4,
    "liveness_timeout": 3,
}


def test_the_workers_and_the_scheduler_build_one_policy_from_the_settings() -> None:
    from moriio import container

    settings = parse_settings(TIMEOUTS)
    policy = settings.transfer_policy()
    # The container has no builder of its own: the workers' policy is the settings' policy.
    assert "TransferPolicy(" not in Path(container.__file__).read_text()
    assert (
        policy.transfer_timeout,
        policy.defer_timeout,
        policy.clock_skew_allowance,
        policy.quarantine_timeout,
        policy.liveness_timeout,
    ) == (2.5, 8.0, 0.5, 4.0, 3.0)


def test_the_scheduler_leases_and_reclaims_by_the_settings_policy() -> None:
    pytest.importorskip("vllm")
    from moriio.container import SchedulerContainer, SchedulerRole
    from moriio.domain.params.transfer_params import TransferParams
    from moriio.domain.scheduler.producer.book import LocalEndpoint
    from moriio.testing.inmemory import FakeClock
    from moriio.vllm_plugin.scheduler_side import SchedulerSide

    parts = SchedulerContainer(
        settings=parse_settings(TIMEOUTS),
        role=SchedulerRole(is_producer=True, is_consumer=False),
        endpoint=LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0"),
        block_size=16,
        clock=FakeClock(),
    )
    side = SchedulerSide(parts)
    book = side.producer
    assert book is not None
    params = TransferParams("tx", False, True, None, None)
    decision = book.on_finished(
        "p-1",
        length_capped=True,
        block_ids=([1, 2],),
        wall_now=1000.0,
        now=50.0,
        params=params,
        prompt=PROMPT,
    )
    assert decision.params is not None
    assert decision.params["lease_expires_at"] == 1008.0  # defer_timeout on our wall clock
    assert book.on_connector_output(None, 58.25) == set()  # within the skew allowance
    assert book.on_connector_output(None, 58.5) == {"p-1"}
