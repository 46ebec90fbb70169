"""vLLM's NixlConnector finds NIXL through the ``nixl`` shim over the ``nixl_cu12`` build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moriio_tools.harness import write_nixl_shim

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(180)]
pytest.importorskip("nixl_cu12", reason="NIXL is not installed")
pytest.importorskip("vllm")

PROBE = """
from vllm.distributed import nixl_utils
agent = nixl_utils.NixlWrapper("probe", nixl_utils.nixl_agent_config(backends=["UCX"]))
print(type(agent).__module__, nixl_utils.nixlXferTelemetry.__module__)
"""


def test_vllm_loads_nixl_through_the_shim(tmp_path: Path) -> None:
    shim = write_nixl_shim(tmp_path / "shim")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")])
    env.setdefault("UCX_MODULES", "^ib")
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["nixl_cu12._api", "nixl_cu12._bindings"]


CONFIG_PROBE = """
from nixl._api import nixl_agent_config
print(nixl_agent_config(num_threads=0).enable_pthread, nixl_agent_config(True).enable_pthread)
"""


@pytest.mark.parametrize(("setting", "expected"), [("0", "False False"), ("1", "True True")])
def test_the_shim_can_turn_the_progress_thread_off(
    tmp_path: Path, setting: str, expected: str
) -> None:
    shim = write_nixl_shim(tmp_path / "shim")
    env = dict(os.environ, MORIIO_NIXL_PROGRESS_THREAD=setting)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CONFIG_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == expected
