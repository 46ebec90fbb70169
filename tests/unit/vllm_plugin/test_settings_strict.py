"""Strict settings: every bad configuration stops start-up with an error naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moriio.config.check import check_config, read_config_arg
from moriio.config.keys import env_notes
from moriio.config.settings import (
    Backend,
    HostFacts,
    SettingsError,
    Transport,
    parse_settings,
    settings_by_key,
    transport_choice,
)

AMD = HostFacts(mori_installed=True, rocm_device=True)
NVIDIA = HostFacts(mori_installed=False, rocm_device=False)
NIXL = {"transport": "nixl"}


def _refused(extra: dict[str, Any], *names: str, facts: HostFacts = NVIDIA) -> str:
    with pytest.raises(SettingsError) as info:
        parse_settings(extra, facts=facts)
    message = str(info.value)
    for name in names:
        assert name in message
    return message


# -- keys --------------------------------------------------------------------------------


def test_an_unknown_key_is_refused_naming_it() -> None:
    _refused({"zzz_unrelated": 1}, "unknown key zzz_unrelated")


@pytest.mark.parametrize(
    ("typo", "key"),
    [
        ("read_mod", "read_mode"),
        ("transfer_timout", "transfer_timeout"),
        ("Read_Mode", "read_mode"),
        ("trusted_remote_host", "trusted_remote_hosts"),
    ],
)
def test_a_typo_is_refused_with_the_key_it_resembles(typo: str, key: str) -> None:
    _refused({typo: 1}, f"unknown key {typo} (did you mean {key}?)")


def test_the_in_tree_recv_abort_timeout_is_refused_naming_the_moriio_key() -> None:
    message = _refused({"recv_abort_timeout": 120}, "recv_abort_timeout", "set transfer_timeout")
    assert "in-tree" in message


def test_the_in_tree_connectors_other_keys_are_moriios_own() -> None:
    """A config written for vLLM's MoRIIOConnector (strings, as it reads them) is accepted."""
    settings = parse_settings(
        {
            "read_mode": "true",
            "handshake_port": "6301",
            "notify_port": "61005",
            "proxy_ip": "10.0.0.9",
            "proxy_ping_port": "36367",
            "http_port": "8100",
            "host_ip": "10.0.0.1",
            "backend": "rdma",
            "qp_per_transfer": "2",
            "post_batch_size": "-1",
            "num_workers": "1",
            "transfer_timeout": "30",
            "defer_timeout": "60",
        },
        facts=AMD,
    )
    assert settings.transport is Transport.MORI
    assert (settings.qp_per_transfer, settings.http_port) == (2, 8100)


# -- values ------------------------------------------------------------------------------

BAD_VALUES = [
    ("trusted_remote_hosts", "10.0.0.0/33"),
    ("trusted_remote_hosts", ","),
    ("trusted_remote_hosts", "10.0.0.1,,10.0.0.2"),
    ("trusted_remote_hosts", ["10.0.0.1", ""]),
    ("trusted_remote_hosts", ["not a host!"]),
    ("trusted_remote_hosts", "10.0.0.1:8000"),
    ("host_ip", "10.0.0.1:8000"),
    ("host_ip", "not an ip!"),
    ("host_ip", "0.0.0.0"),
    ("host_ip", " 10.0.0.1"),
    ("read_mode", ""),
    ("same_host_copies", ""),
    ("liveness_timeout", "-1"),
    ("idle_step_wait", "soon"),
    ("proxy_ip", "10.0.0.9:36367"),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_its_key(key: str, value: object) -> None:
    _refused({**NIXL, key: value}, key)


def test_a_missing_secret_file_is_refused_naming_the_key_and_path() -> None:
    _refused({"shared_secret_file": "/nonexistent/secret"}, "shared_secret_file", "/nonexistent")


def test_a_directory_or_short_secret_file_is_refused(tmp_path: Path) -> None:
    _refused({"shared_secret_file": str(tmp_path)}, "shared_secret_file", str(tmp_path))
    short = tmp_path / "short"
    short.write_text("tiny\n")
    _refused({"shared_secret_file": str(short)}, "shared_secret_file", "16 bytes")


def test_a_readable_secret_file_is_accepted(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123\n")
    assert parse_settings({"shared_secret_file": str(secret)}).shared_secret_file == str(secret)


def test_xgmi_with_nixl_is_refused_naming_both_keys() -> None:
    _refused({"backend": "xgmi", "transport": "nixl"}, "backend", "transport", "nixl")
    _refused({"backend": "xgmi"}, "backend xgmi", "chosen for this host")  # NIXL by default
    assert parse_settings({"backend": "xgmi"}, facts=AMD).backend is Backend.XGMI


def test_mori_where_it_is_missing_names_the_fix() -> None:
    _refused({"transport": "mori"}, "transport", '"transport": "nixl"')


def test_mori_advertises_ipv4_literals_only() -> None:
    _refused({"transport": "mori", "host_ip": "pod.example"}, "host_ip", "IPv4", facts=AMD)
    _refused({"transport": "mori", "host_ip": "fd00::1"}, "host_ip", facts=AMD)
    assert parse_settings({"host_ip": "pod.example", **NIXL}).host_ip == "pod.example"


# -- documented string forms -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "attribute", "expected"),
    [
        ("liveness_timeout", "0", "liveness_timeout", 0.0),
        ("liveness_timeout", "2.5", "liveness_timeout", 2.5),
        ("idle_step_wait", "0", "idle_step_wait", 0.0),
        ("idle_step_wait", " 0.02 ", "idle_step_wait", 0.02),
        ("clock_skew_allowance", "0", "clock_skew_allowance", 0.0),
        ("handshake_port", "7001", "handshake_port", 7001),
        ("same_host_copies", "false", "same_host_copies", False),
        ("proxy_ping_interval", "1.5", "proxy_ping_interval", 1.5),
        ("trusted_remote_hosts", "10.0.0.0/8, Pod.Example", "trusted_remote_hosts", None),
    ],
)
def test_a_documented_string_form_is_accepted(
    key: str, value: str, attribute: str, expected: object
) -> None:
    settings = parse_settings({**NIXL, key: value})
    if expected is None:
        assert settings.trusted_remote_hosts == ("10.0.0.0/8", "pod.example")
    else:
        assert getattr(settings, attribute) == expected


# -- transport chosen by host ------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "transport"),
    [
        (AMD, Transport.MORI),
        (NVIDIA, Transport.NIXL),
        (HostFacts(mori_installed=True, rocm_device=False), Transport.NIXL),
        (HostFacts(mori_installed=False, rocm_device=True), Transport.NIXL),
    ],
)
def test_transport_is_chosen_by_host_when_absent(facts: HostFacts, transport: Transport) -> None:
    assert parse_settings({}, facts=facts).transport is transport
    assert parse_settings(NIXL, facts=facts).transport is Transport.NIXL
    assert transport_choice({}, facts).startswith("chosen for this host")
    assert transport_choice(NIXL, facts) == "as configured"


# -- environment variables ---------------------------------------------------------------


def test_an_in_tree_env_var_names_its_key_and_says_when_it_conflicts() -> None:
    settings = parse_settings(NIXL)  # WRITE mode
    (note,) = env_notes({"VLLM_MORIIO_CONNECTOR_READ_MODE": "1"}, settings_by_key(settings))
    assert "read_mode" in note
    assert "conflicts" in note
    (note,) = env_notes({"VLLM_MORIIO_CONNECTOR_READ_MODE": "0"}, settings_by_key(settings))
    assert "conflicts" not in note
    (note,) = env_notes({"VLLM_MORIIO_TRANSFER_TIMEOUT_S": "120"}, settings_by_key(settings))
    assert "transfer_timeout" in note
    assert "conflicts" in note


# -- checking without an engine ----------------------------------------------------------


def test_check_config_lists_every_problem() -> None:
    report = check_config(
        {"read_mod": True, "host_ip": "10.0.0.1:8000", "trusted_remote_hosts": ","}, {}, NVIDIA
    )
    assert report.settings is None
    assert len(report.errors) == 3
    for key in ("read_mod", "host_ip", "trusted_remote_hosts"):
        assert any(key in error for error in report.errors)


def test_check_config_reports_cross_key_problems_once_values_are_valid() -> None:
    report = check_config({"proxy_ip": "10.0.0.9"}, {}, NVIDIA)
    assert report.errors == ["set both proxy_ip and proxy_ping_port to register with a router"]
    report = check_config(NIXL, {"VLLM_MORIIO_NUM_WORKERS": "4"}, NVIDIA)
    assert report.settings is not None
    assert report.summary.startswith("valid: transport nixl (as configured)")
    assert any("num_workers" in w for w in report.warnings)


def test_the_config_argument_is_inline_json_a_file_or_a_whole_transfer_config(
    tmp_path: Path,
) -> None:
    assert read_config_arg('{"read_mode": true}') == {"read_mode": True}
    path = tmp_path / "kv.json"
    path.write_text('{"kv_connector": "MoriioKVConnector", "kv_connector_extra_config": {"a": 1}}')
    assert read_config_arg(f"@{path}") == {"a": 1}
    for bad in ("[1, 2]", "{", f"@{tmp_path / 'missing.json'}"):
        with pytest.raises(ValueError, match="--config"):
            read_config_arg(bad)


def test_doctor_config_prints_each_error_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    from moriio.cli.main import main

    assert main(["doctor", "--config", '{"read_mod": true, "host_ip": "not an ip!"}']) == 1
    out = capsys.readouterr().out
    assert "FAIL  config  unknown key read_mod (did you mean read_mode?)" in out
    assert "host_ip" in out
    assert main(["doctor", "--config", '{"transport": "nixl", "liveness_timeout": "0"}']) == 0
    assert "PASS  config  valid: transport nixl" in capsys.readouterr().out


# -- the earliest hook vLLM offers -------------------------------------------------------


@pytest.mark.vllm
def test_vllms_config_time_hook_validates_the_settings() -> None:
    pytest.importorskip("vllm")
    from moriio.vllm_plugin import MoriioKVConnector

    with pytest.raises(SettingsError, match=r"read_mod \(did you mean read_mode\?\)"):
        MoriioKVConnector.requires_piecewise_for_cudagraph({"read_mod": True})
    assert MoriioKVConnector.requires_piecewise_for_cudagraph(NIXL) is False
