"""Named NIXL failures: the likely cause of an error NIXL reports under a misleading name.

UCX without a zero-copy protocol for device memory falls back to software emulation (over
TCP). An operator who forbids that (``UCX_PROTO_EMULATION_ENABLE=n``) gets the transfer
refused, and NIXL reports the refusal as ``NIXL_ERR_REMOTE_DISCONNECT`` at post time although
the peer is alive. Such a batch fails as an ordinary, settled transfer: the adapter neither
removes the peer nor leaves the batch for the poster to quarantine and tear down.

A peer that really died is told apart: once a device batch in one direction to a peer has
succeeded, UCX has a protocol for it, so a later disconnect there keeps NIXL's own words
(the engine passes that knowledge as ``proven``). Which protocol UCX takes per direction is
probed at start-up (:mod:`moriio.adapters.nixl.protocols`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

EMULATION_FORBIDDEN = "UCX emulation forbidden"  # the failure's name, first in its message
EMULATION_VARIABLE = "UCX_PROTO_EMULATION_ENABLE"
GET_ZCOPY_VARIABLE = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
_OFF = frozenset({"n", "no", "0", "off", "false"})
_ON = frozenset({"y", "yes", "1", "on", "true"})
_DISCONNECT_MARKS = ("REMOTE_DISCONNECT", "RemoteDisconnect")


def emulation_forbidden(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``UCX_PROTO_EMULATION_ENABLE`` forbids UCX's software fallback."""
    env = os.environ if environ is None else environ
    return env.get(EMULATION_VARIABLE, "").strip().lower() in _OFF


def explain(state: str, device: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The named cause of a failed batch, or None when NIXL's own ``state`` says it all.

    ``device``: the batch moves device memory on either side.
    """
    env = os.environ if environ is None else environ
    if not device or not emulation_forbidden(env):
        return None
    if not any(mark in state for mark in _DISCONNECT_MARKS):
        return None
    get_zcopy = env.get(GET_ZCOPY_VARIABLE, "auto")
    if get_zcopy.strip().lower() in _ON:
        remedy = (
            f"{GET_ZCOPY_VARIABLE}={get_zcopy} is set, so check that UCX_TLS keeps cuda_ipc, "
            "that the KV memory is exportable (no expandable_segments:True) and, between "
            "hosts, that GPUDirect RDMA works"
        )
    else:
        remedy = f"set {GET_ZCOPY_VARIABLE}=y (moriio's default when unset)"
    return (
        f"{EMULATION_FORBIDDEN}: UCX found no zero-copy protocol for device memory and "
        f"{EMULATION_VARIABLE}={env[EMULATION_VARIABLE]} forbids the software fallback: "
        f"{remedy}, or allow emulation (slow); the peer is not known to be gone ({state})"
    )
