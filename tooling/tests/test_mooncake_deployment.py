"""vLLM's MooncakeConnector 1P1D: engine settings, proxy request shaping, shim, availability."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from moriio_tools.serve import mooncake_deployment
from moriio_tools.serve.mooncake_deployment import (
    LIB_DIR_ENV,
    mooncake_available,
    mooncake_engine_env,
    mooncake_library_env,
    mooncake_transfer_config,
)
from moriio_tools.serve.mooncake_proxy import (
    MooncakeProxy,
    mooncake_decode_body,
    mooncake_prefill_body,
)
from moriio_tools.serve.mooncake_shim import MODULE, SHIM, write_mooncake_shim
from support.peer_proxies import post_through

CLIENT = {
    "model": "m",
    "prompt": [11, 12, 13],
    "max_tokens": 16,
    "stop": ["\n"],
    "stream": True,
    "stream_options": {"include_usage": True},
}
BOOT = "http://127.0.0.1:8998"


def test_each_engine_loads_the_connector_through_the_shim_over_tcp() -> None:
    prefill = mooncake_transfer_config("kv_producer", "mc-prefill")
    decode = mooncake_transfer_config("kv_consumer", "mc-decode")
    for config in (prefill, decode):
        assert config["kv_connector"] == "MooncakeConnector"
        assert config["kv_connector_module_path"] == MODULE
        extra = config["kv_connector_extra_config"]
        assert extra["mooncake_protocol"] == "tcp"
        assert extra["device_name"] == ""
        assert extra["num_workers"] == 2
    assert (prefill["kv_role"], prefill["engine_id"]) == ("kv_producer", "mc-prefill")
    assert (decode["kv_role"], decode["engine_id"]) == ("kv_consumer", "mc-decode")


def test_only_the_prefill_serves_the_bootstrap_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv(LIB_DIR_ENV, raising=False)
    prefill = mooncake_engine_env(tmp_path, 8998)
    decode = mooncake_engine_env(tmp_path, None)
    for env in (prefill, decode):
        assert env["PYTHONPATH"] == f"{tmp_path}:/elsewhere"
        assert env["VLLM_HOST_IP"] == "127.0.0.1"
        assert env["VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"] == "60"
        assert "LD_LIBRARY_PATH" not in env
    assert prefill["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in decode


def test_the_library_directory_goes_first_on_the_engines_library_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIB_DIR_ENV, "/opt/ibv")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/lib")
    assert mooncake_library_env() == {"LD_LIBRARY_PATH": "/opt/ibv:/usr/local/lib"}
    assert mooncake_engine_env(tmp_path, None)["LD_LIBRARY_PATH"] == "/opt/ibv:/usr/local/lib"


def test_the_prefill_leg_asks_for_exactly_one_token_kept_for_a_remote_decode() -> None:
    body = mooncake_prefill_body(CLIENT, "t1")
    assert (body["max_tokens"], body["min_tokens"], body["stream"]) == (1, 1, False)
    assert "stop" not in body
    assert "stream_options" not in body
    assert body["prompt"] == [11, 12, 13]
    assert body["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": "t1",
    }
    assert CLIENT["max_tokens"] == 16  # the client's request is not modified
    assert CLIENT["stop"] == ["\n"]


def test_the_decode_leg_names_the_prefill_engine_and_its_bootstrap_server() -> None:
    body = mooncake_decode_body(CLIENT, "t1", BOOT, "mc-prefill")
    assert body["kv_transfer_params"] == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "mc-prefill",
        "remote_bootstrap_addr": BOOT,
        "transfer_id": "t1",
    }
    assert (body["max_tokens"], body["stream"], body["stop"]) == (16, True, ["\n"])
    assert "kv_transfer_params" not in CLIENT


async def _through_proxy(prefill_status: int) -> tuple[int, str, list[Any], list[Any]]:
    """One request through a MooncakeProxy in front of stand-in engines."""
    prefill_seen: list[dict[str, Any]] = []
    decode_seen: list[dict[str, Any]] = []

    async def prefill(request: web.Request) -> web.Response:
        prefill_seen.append({"body": await request.json(), "rid": request.headers["X-Request-Id"]})
        return web.json_response({"choices": []}, status=prefill_status)

    async def decode(request: web.Request) -> web.Response:
        decode_seen.append({"body": await request.json(), "rid": request.headers["X-Request-Id"]})
        return web.Response(text="data: done\n\n")

    def proxy(prefill_url: str, decode_url: str) -> MooncakeProxy:
        return MooncakeProxy([prefill_url], [decode_url], BOOT, "mc-prefill")

    status, text = await post_through(proxy, prefill, decode, CLIENT)
    return status, text, prefill_seen, decode_seen


def test_the_proxy_sends_the_decode_after_the_prefill_with_one_transfer_id() -> None:
    status, text, prefill_seen, decode_seen = asyncio.run(_through_proxy(200))
    assert (status, text) == (200, "data: done\n\n")
    sent = prefill_seen[0]["body"]
    got = decode_seen[0]["body"]
    assert (sent["max_tokens"], sent["min_tokens"]) == (1, 1)
    assert sent["kv_transfer_params"]["do_remote_decode"] is True
    params = got["kv_transfer_params"]
    assert params["transfer_id"] == sent["kv_transfer_params"]["transfer_id"]
    assert (params["remote_engine_id"], params["remote_bootstrap_addr"]) == ("mc-prefill", BOOT)
    assert got["max_tokens"] == 16
    assert prefill_seen[0]["rid"] == decode_seen[0]["rid"]


def test_a_failed_prefill_is_the_answer_and_no_decode_is_sent() -> None:
    status, _, prefill_seen, decode_seen = asyncio.run(_through_proxy(500))
    assert status == 500
    assert len(prefill_seen) == 1
    assert decode_seen == []


def test_the_proxy_needs_engines() -> None:
    with pytest.raises(ValueError, match="prefill and one decode"):
        MooncakeProxy(["http://127.0.0.1:1"], [], BOOT, "mc-prefill")


def test_the_shim_is_one_module_that_compiles(tmp_path: Path) -> None:
    directory = write_mooncake_shim(tmp_path / "shim")
    written = directory / f"{MODULE}.py"
    assert written.read_text() == SHIM
    compile(SHIM, str(written), "exec")
    assert "torch.accelerator.current_device_index = lambda: 0" in SHIM
    assert "if not torch.accelerator.is_available():" in SHIM


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mooncake_deployment, "MOONCAKE_PACKAGE", "moriio_no_such_package")
    reason = mooncake_available()
    assert reason is not None
    assert "'moriio_no_such_package' package is not importable" in reason


def test_a_library_that_cannot_be_loaded_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mooncake_deployment, "MOONCAKE_PACKAGE", "aiohttp")  # present
    monkeypatch.setattr(mooncake_deployment, "VERBS_LIBRARY", "libmoriio-absent.so.1")
    monkeypatch.setenv(LIB_DIR_ENV, str(tmp_path))
    reason = mooncake_available()
    assert reason is not None
    assert reason.startswith("libmoriio-absent.so.1 cannot be loaded")
    assert LIB_DIR_ENV in reason
    assert "\n" not in reason


def test_a_loadable_library_and_package_are_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mooncake_deployment, "MOONCAKE_PACKAGE", "aiohttp")
    monkeypatch.setattr(mooncake_deployment, "VERBS_LIBRARY", "libc.so.6")
    assert mooncake_available() is None
