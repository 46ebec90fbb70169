"""The short envelope same-host device copies add to the transport's metadata and region
descriptors, and the identity of the process that sent it.

A process is named by its host (the boot id, shared by every container of the host) and a
random token drawn once per process: process ids repeat across containers of one host.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moriio.ports import TransferEngineError

MAGIC = b"moriio-ipc1"
MAX_HEADER_BYTES = 4096
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def wrap(header: dict[str, Any], inner: bytes) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(body)) + body + inner


def unwrap(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The envelope's header and the transport's bytes (an empty header: no envelope)."""
    if not data.startswith(MAGIC):
        return {}, data
    start = len(MAGIC) + 4
    if len(data) < start:
        raise TransferEngineError("truncated same-host envelope")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    if length > MAX_HEADER_BYTES or len(data) < start + length:
        raise TransferEngineError(f"same-host envelope header of {length} bytes refused")
    try:
        header = json.loads(data[start : start + length])
    except ValueError as exc:
        raise TransferEngineError(f"same-host envelope is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise TransferEngineError("same-host envelope header is not an object")
    return header, data[start + length :]


def host_identity() -> str:
    """Equal for processes on one host (its boot id), different across hosts."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return f"host-{os.uname().nodename}"


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Who sent an envelope: ``host`` tells hosts apart, ``token`` processes on one host."""

    host: str
    token: str
    pid: int  # for the logs only

    @classmethod
    def of_this_process(cls) -> ProcessIdentity:
        return cls(host_identity(), secrets.token_hex(8), os.getpid())

    def header(self) -> dict[str, Any]:
        return {"host": self.host, "process": self.token, "pid": self.pid}

    def same_host(self, header: dict[str, Any]) -> bool:
        return header.get("host") == self.host

    def is_me(self, header: dict[str, Any]) -> bool:
        return header.get("process") == self.token
