"""Make vLLM's own NixlConnector importable next to the ``nixl_cu12`` build of NIXL.

vLLM loads NIXL as ``nixl._api`` / ``nixl._bindings``; the wheel installed here is named
``nixl_cu12`` (same API, CUDA-tagged name). :func:`write_nixl_shim` writes a one-file
``nixl`` package that aliases those two modules; put its directory first on ``PYTHONPATH``
of the engines that run NixlConnector (nothing else changes, vLLM is not patched).

vLLM offers no setting for NIXL's progress thread (it creates every agent with it on). With
``MORIIO_NIXL_PROGRESS_THREAD=0`` in an engine's environment the shim makes
``nixl_agent_config`` default to ``enable_prog_thread=False``, so that thread can be turned off
for comparisons; without it the shim changes nothing.
"""

from __future__ import annotations

from pathlib import Path

SHIM = '''"""``nixl`` for vLLM's NixlConnector, backed by the installed ``nixl_cu12`` build."""

import importlib
import os
import sys

for _name in ("_api", "_bindings"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"nixl_cu12.{_name}")

if os.environ.get("MORIIO_NIXL_PROGRESS_THREAD", "1") == "0":
    _api = sys.modules[f"{__name__}._api"]
    _config = _api.nixl_agent_config

    class _NoProgressThread(_config):
        def __init__(self, *args, **kwargs):
            if args:
                args = (False, *args[1:])
            else:
                kwargs["enable_prog_thread"] = False
            super().__init__(*args, **kwargs)

    _api.nixl_agent_config = _NoProgressThread
'''


def write_nixl_shim(directory: Path) -> Path:
    """Write the ``nixl`` package under ``directory``; returns the directory to put on
    ``PYTHONPATH``."""
    package = directory / "nixl"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(SHIM)
    return directory
