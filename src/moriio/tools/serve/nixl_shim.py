"""Make vLLM's own NixlConnector importable next to the ``nixl_cu12`` build of NIXL.

vLLM loads NIXL as ``nixl._api`` / ``nixl._bindings``; the wheel installed here is named
``nixl_cu12`` (same API, CUDA-tagged name). :func:`write_nixl_shim` writes a one-file
``nixl`` package that aliases those two modules; put its directory first on ``PYTHONPATH``
of the engines that run NixlConnector (nothing else changes, vLLM is not patched).
"""

from __future__ import annotations

from pathlib import Path

SHIM = '''"""``nixl`` for vLLM's NixlConnector, backed by the installed ``nixl_cu12`` build."""

import importlib
import sys

for _name in ("_api", "_bindings"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"nixl_cu12.{_name}")
'''


def write_nixl_shim(directory: Path) -> Path:
    """Write the ``nixl`` package under ``directory``; returns the directory to put on
    ``PYTHONPATH``."""
    package = directory / "nixl"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(SHIM)
    return directory
