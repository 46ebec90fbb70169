"""The transfer engine of a configuration: ``transport`` as given, or chosen for this host.

Without ``transport``, mori is chosen where the ``mori`` package is installed and the host
has an AMD GPU (``/dev/kfd``, or a ROCm build of an already imported torch); NIXL elsewhere.
An explicit ``"transport": "mori"`` where mori is not installed stops start-up naming the fix.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib.util import find_spec

KFD = "/dev/kfd"  # the ROCm kernel driver's device


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the choice depends on; :func:`host_facts` reads them from this process."""

    mori_installed: bool
    rocm_device: bool


def host_facts() -> HostFacts:
    return HostFacts(mori_installed=mori_installed(), rocm_device=rocm_device())


def mori_installed() -> bool:
    """Whether the ``mori`` package can be found (it is not imported)."""
    if "mori" in sys.modules:
        return True
    try:
        return find_spec("mori") is not None
    except (ImportError, ValueError):
        return False


def rocm_device() -> bool:
    """Whether this host has an AMD GPU driver (torch is consulted only if imported)."""
    if os.path.exists(KFD):
        return True
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    return getattr(version, "hip", None) is not None


def auto_transport(facts: HostFacts) -> tuple[str, str]:
    """The transport for a configuration without one, and why."""
    if facts.mori_installed and facts.rocm_device:
        return "mori", "mori is installed and the host has an AMD GPU"
    if not facts.mori_installed:
        return "nixl", "mori is not installed"
    return "nixl", "no AMD GPU (ROCm) device on this host"


def mori_missing_error() -> str:
    return (
        'transport is "mori" but the mori package (amd-mori) is not installed here: install '
        'it, or set "transport": "nixl" (or leave transport out to choose by host)'
    )
