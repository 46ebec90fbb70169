"""Load vLLM's own MooncakeConnector on a host whose torch has no accelerator.

vLLM's MooncakeConnector calls ``torch.accelerator.current_device_index()`` when its worker
side starts, only to hand the index to ``current_platform.set_device`` (a no-op on the CPU
platform). With a CPU-only torch that call raises ("Cannot access accelerator device when
none is available"): vLLM's CPU model runner stands in only for ``synchronize`` and
``empty_cache``, not for it.

:func:`write_mooncake_shim` writes a one-file module, ``moriio_mooncake_cpu``, that imports
vLLM's ``MooncakeConnector`` and re-exports it unchanged. Only when
``torch.accelerator.is_available()`` is False does it replace
``torch.accelerator.current_device_index`` with a function that returns 0; nothing else is
patched, and vLLM's files are not changed. An engine loads it with ``kv_connector:
"MooncakeConnector"`` and ``kv_connector_module_path: "moriio_mooncake_cpu"``, with the
module's directory on its ``PYTHONPATH``: vLLM then imports the module and takes the class
of that name from it, so the patch is made only in the processes that load the connector.
"""

from __future__ import annotations

from pathlib import Path

MODULE = "moriio_mooncake_cpu"

SHIM = '''"""vLLM's MooncakeConnector, with ``torch.accelerator.current_device_index`` answering 0
when torch has no accelerator (it raises there; its one use here is a CPU no-op)."""

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnector,
)

__all__ = ["MooncakeConnector"]

if not torch.accelerator.is_available():
    torch.accelerator.current_device_index = lambda: 0
'''


def write_mooncake_shim(directory: Path) -> Path:
    """Write :data:`MODULE` under ``directory``; returns the directory to put on
    ``PYTHONPATH``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{MODULE}.py").write_text(SHIM)
    return directory
