"""Import of the NIXL package, after applying moriio's UCX environment defaults.

Environment defaults, applied before NIXL is imported and only where the variable is unset:

* ``UCX_MODULES=^ib`` -- skip UCX's InfiniBand/EFA modules. With system rdma-core installed
  they load a second libnl and every process that created an agent segfaults at exit; they
  are also useless without an RDMA NIC and slow down start-up.
* ``UCX_NET_DEVICES=lo`` -- only for loopback use (``loopback=True`` or ``host`` of
  127.0.0.1/localhost): keeps UCX's TCP lanes on the loopback interface.
* ``UCX_SCOPY_TX_QUOTA=64`` -- same-host copies (CMA): UCX's default of 1 starts one queued
  ``process_vm_readv``/``writev`` per worker progress call, and every progress call also polls
  the TCP lanes (an ``epoll_wait`` syscall), i.e. two syscalls per descriptor; 64 starts up
  to 64 per progress call, which makes scattered blocks (one descriptor each) ~3% faster. A
  post already copies synchronously, so the longer progress call blocks nothing new.

Other UCX variables are left alone; ``UCX_TLS=tcp`` forces pure TCP where cross-memory
attach (``process_vm_readv``) is forbidden, e.g. by a container's seccomp policy.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

SCOPY_TX_QUOTA = "64"  # same-host copies started per UCX progress call (UCX's default: 1)
INSTALL_HINT = "pip install --no-deps 'nixl-cu12==1.5.1' (or the moriio[nixl] extra)"


@dataclass(frozen=True, slots=True)
class NixlApi:
    """The pieces of the NIXL Python API the adapter uses."""

    module: str
    agent: Any  # nixl_agent class
    agent_config: Any  # nixl_agent_config class
    errors: tuple[type[Exception], ...]  # NIXL's typed exceptions


def env_defaults(loopback: bool) -> dict[str, str]:
    """UCX settings moriio wants unless the user chose otherwise."""
    defaults = {"UCX_MODULES": "^ib", "UCX_SCOPY_TX_QUOTA": SCOPY_TX_QUOTA}
    if loopback:
        defaults["UCX_NET_DEVICES"] = "lo"
    return defaults


def apply_env_defaults(loopback: bool) -> dict[str, str]:
    """Set every default the user has not set; return the ones this call set."""
    applied = {}
    for key, value in env_defaults(loopback).items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    return applied


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
    """Apply the environment defaults, then import ``nixl`` (or ``nixl_cu12``).

    Raises ImportError with an install hint when neither is importable.
    """
    apply_env_defaults(loopback)
    failures = []
    for name in ("nixl", "nixl_cu12"):
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
