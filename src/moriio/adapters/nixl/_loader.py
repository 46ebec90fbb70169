"""Import of the NIXL package, after applying moriio's UCX environment defaults.

Environment defaults, applied before NIXL is imported and only where the variable is unset:

* ``UCX_MODULES=^ib`` -- only on a host without RDMA (no verbs device under
  ``/sys/class/infiniband``): skips UCX's InfiniBand/EFA modules there. With system
  rdma-core installed they load a second libnl and every process that created an agent
  segfaults at exit; they are useless without an RDMA NIC and slow down start-up. A host
  with an InfiniBand/RoCE device keeps them: they carry GPUDirect RDMA.
* ``UCX_NET_DEVICES=lo`` -- only for loopback use (``loopback=True`` or ``host`` of
  127.0.0.1/localhost): keeps UCX's TCP lanes on the loopback interface.
* ``UCX_SCOPY_TX_QUOTA=64`` -- same-host copies (CMA): UCX's default of 1 starts one queued
  ``process_vm_readv``/``writev`` per worker progress call, and every progress call also polls
  the TCP lanes (an ``epoll_wait`` syscall), i.e. two syscalls per descriptor; 64 starts up
  to 64 per progress call, which makes scattered blocks (one descriptor each) ~3% faster. A
  post already copies synchronously, so the longer progress call blocks nothing new.
* ``UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y`` -- hosts with an NVIDIA driver (elsewhere UCX has no
  cuda_ipc module and would warn of an unused variable): UCX switches cuda_ipc GET off where it
  finds no NVLink (PCIe GPUs, single-GPU VMs), and a READ of device memory then falls back
  to software emulation over TCP (0.45 GB/s on an H200 instead of 150-830 GB/s). Host
  memory never takes cuda_ipc, so it is unaffected.

Other UCX variables are left alone; ``UCX_TLS=tcp`` forces pure TCP where cross-memory
attach (``process_vm_readv``) is forbidden, e.g. by a container's seccomp policy. The
effective values (every ``UCX_*`` variable, and which of them moriio set) are logged once per
process.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio.log import get_logger

_log = get_logger("moriio.nixl")

VERBS_DEVICES = Path("/sys/class/infiniband")  # one entry per InfiniBand/RoCE device
NVIDIA_DRIVER = Path("/proc/driver/nvidia")  # present where the NVIDIA kernel driver runs
LOGGED_VARIABLES = (  # logged even when unset
    "UCX_MODULES",
    "UCX_NET_DEVICES",
    "UCX_TLS",
    "UCX_SCOPY_TX_QUOTA",
    "UCX_CUDA_IPC_ENABLE_GET_ZCOPY",
)
SCOPY_TX_QUOTA = "64"  # same-host copies started per UCX progress call (UCX's default: 1)
CUDA_IPC_GET_ZCOPY = "y"  # UCX's "auto" turns it off without NVLink: READ falls back to TCP
# --no-deps: nixl-cu12 declares torch, and pip must not fetch PyPI's CUDA build next to vLLM's.
INSTALL_HINT = "pip install --no-deps 'nixl-cu12==1.5.1' (after vLLM, into the same environment)"


@dataclass(frozen=True, slots=True)
class NixlApi:
    """The pieces of the NIXL Python API the adapter uses."""

    module: str
    agent: Any  # nixl_agent class
    agent_config: Any  # nixl_agent_config class
    errors: tuple[type[Exception], ...]  # NIXL's typed exceptions


def rdma_devices(root: Path | None = None) -> tuple[str, ...]:
    """The host's verbs (InfiniBand/RoCE) devices, e.g. ``("mlx5_0",)``; none without RDMA."""
    try:
        return tuple(sorted(entry.name for entry in (root or VERBS_DEVICES).iterdir()))
    except OSError:
        return ()


def env_defaults(loopback: bool, rdma: Sequence[str] = (), gpus: bool = False) -> dict[str, str]:
    """UCX settings moriio wants unless the user chose otherwise, for a host whose verbs
    devices are ``rdma``, with NVIDIA GPUs or not."""
    defaults = {"UCX_SCOPY_TX_QUOTA": SCOPY_TX_QUOTA}
    if gpus:
        defaults["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = CUDA_IPC_GET_ZCOPY
    if not rdma:
        defaults["UCX_MODULES"] = "^ib"
    if loopback:
        defaults["UCX_NET_DEVICES"] = "lo"
    return defaults


def apply_env_defaults(
    loopback: bool, rdma: Sequence[str] | None = None, gpus: bool | None = None
) -> dict[str, str]:
    """Set every default the user has not set; return the ones this call set.

    ``rdma``: the host's verbs devices (default: found under ``/sys/class/infiniband``);
    ``gpus``: whether NVIDIA GPUs are present (default: the driver's ``/proc`` entry).
    The effective UCX environment is logged the first time.
    """
    devices = rdma_devices() if rdma is None else tuple(rdma)
    nvidia = NVIDIA_DRIVER.exists() if gpus is None else gpus
    applied = {}
    for key, value in env_defaults(loopback, devices, nvidia).items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    _log_once(devices, applied)
    return applied


_logged = False


def _log_once(devices: tuple[str, ...], applied: dict[str, str]) -> None:
    global _logged
    if _logged:
        return
    _logged = True
    effective = {key: os.environ.get(key, "(unset)") for key in LOGGED_VARIABLES}
    effective.update((k, v) for k, v in os.environ.items() if k.startswith("UCX_"))
    users = sorted(k for k in os.environ if k.startswith("UCX_") and k not in applied)
    _log.info(
        "UCX environment for NIXL",
        rdma_devices=",".join(devices) or "none",
        set_by_moriio=",".join(sorted(applied)) or "none",
        set_by_user=",".join(users) or "none",
        **dict(sorted(effective.items())),
    )


def _typed_errors(bindings: object) -> tuple[type[Exception], ...]:
    found = []
    for name in dir(bindings):
        obj = getattr(bindings, name)
        if (
            name.startswith("nixl")
            and name.endswith("Error")
            and isinstance(obj, type)
            and issubclass(obj, Exception)
        ):
            found.append(obj)
    return tuple(found)


def load_nixl(loopback: bool) -> NixlApi:
    """Apply the environment defaults, then import ``nixl`` (or ``nixl_cu12``, ``nixl_cu13``).

    Raises ImportError with an install hint when neither is importable.
    """
    apply_env_defaults(loopback)
    failures = []
    for name in ("nixl", "nixl_cu12", "nixl_cu13"):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            failures.append(f"{name}: {exc}")
            continue
        agent = module.nixl_agent
        bindings = getattr(importlib.import_module(agent.__module__), "nixlBind", None)
        if bindings is None:
            bindings = importlib.import_module(f"{name}._bindings")
        return NixlApi(name, agent, module.nixl_agent_config, _typed_errors(bindings))
    raise ImportError(f"NIXL is not importable ({'; '.join(failures)}); install it: {INSTALL_HINT}")
