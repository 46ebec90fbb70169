"""A signalled tool stops every process it started, then exits; nothing of it is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from moriio_tools.serve.processes import ManagedProcess, session_stats
from support.tool_processes import tool_processes, wait_for

# A tool: two process groups, each a child that spawns a grandchild; the second ignores
# SIGTERM, so only the SIGKILL after the grace period ends it.
TOOL = """
import sys, time
from pathlib import Path
from moriio.cli import shutdown
from moriio_tools.serve.processes import ManagedProcess, session_stats
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


# A server that, like ``vllm serve``, stops its own children: each process notes a SIGTERM.
SERVER = """
import signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
child = (
    "import signal, sys, time; from pathlib import Path; "
    "note = lambda *_: (Path(sys.argv[1]).write_text('term'), sys.exit(0)); "
    "signal.signal(signal.SIGTERM, note); print('ready', flush=True); time.sleep(300)"
)
proc = subprocess.Popen([sys.executable, "-c", child, str(out / "child")], stdout=subprocess.PIPE)
proc.stdout.readline()
def stop(*_):
    (out / "server").write_text("term")
    sys.exit(0)  # its child is left to the group's SIGKILL
signal.signal(signal.SIGTERM, stop)
(out / "ready").write_text("")
time.sleep(300)
"""


def test_stopping_a_server_signals_it_alone_and_kills_what_it_leaves(tmp_path: Path) -> None:
    """SIGTERM to the server only (``vllm serve`` stops its own engine processes); its group
    is SIGKILLed after the grace."""
    server = ManagedProcess(
        "server",
        [sys.executable, "-c", SERVER, str(tmp_path)],
        log_path=tmp_path / "s.log",
        ready_url="",
    )
    server.start()
    try:
        assert wait_for((tmp_path / "ready").exists, 20.0), (tmp_path / "s.log").read_text()
        pid = server.pid
        assert pid is not None
        server.stop(grace=5.0)
        assert (tmp_path / "server").read_text() == "term"
        assert not (tmp_path / "child").exists()  # never SIGTERMed: killed with its group
        assert wait_for(lambda: not _running_in_session(pid), 5.0), session_stats([pid])
    finally:
        server.kill()


def _running_in_session(leader: int) -> list[int]:
    """The processes of ``leader``'s session that are not zombies (exited, unreaped)."""
    return [pid for pid, fields in session_stats([leader]).items() if fields[0] != "Z"]
