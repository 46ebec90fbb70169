"""A signalled tool stops every process it started, then exits; nothing of it is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.tool_processes import tool_processes, wait_for

# A tool: two process groups, each a child that spawns a grandchild; the second ignores
# SIGTERM, so only the SIGKILL after the grace period ends it.
TOOL = """
import sys, time
from pathlib import Path
from moriio.tools.serve import shutdown
from moriio.tools.serve.processes import ManagedProcess
shutdown.install(grace=1.0)
stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
for i, prefix in enumerate(["", stubborn]):
    code = prefix + "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    ManagedProcess(f"child{i}", [sys.executable, "-c", code],
                   log_path=Path(sys.argv[1]) / f"child{i}.log", ready_url="").start()
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_tool_leaves_no_process_of_its_own(tmp_path: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    tool = subprocess.Popen(
        [sys.executable, "-c", TOOL, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert tool.stdout is not None
        assert tool.stdout.readline().strip() == b"ready"
        assert wait_for(lambda: len(tool_processes(tool.pid)) == 4, 10.0)
        tool.send_signal(sig)
        assert tool.wait(timeout=20.0) == 128 + sig
        assert wait_for(lambda: not tool_processes(tool.pid), 5.0), tool_processes(tool.pid)
    finally:
        if tool.poll() is None:
            tool.kill()
