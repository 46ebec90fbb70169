"""`import moriio` must stay light: no heavy or networked dependency at import time."""

import json
import subprocess
import sys

HEAVY = ("torch", "vllm", "zmq", "nixl", "nixl_cu12", "mori", "msgpack")


def test_import_moriio_pulls_in_no_heavy_dependency() -> None:
    code = (
        "import json, sys; import moriio, moriio.core, moriio.domain, moriio.ports; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == []


def test_import_moriio_reads_no_environment_variable() -> None:
    code = (
        "import os\n"
        "seen = []\n"
        "class Spy(dict):\n"
        "    def __getitem__(self, k): seen.append(k); return super().__getitem__(k)\n"
        "    def get(self, k, d=None): seen.append(k); return super().get(k, d)\n"
        "os.environ = Spy(os.environ)\n"
        "import moriio\n"
        "print(seen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
