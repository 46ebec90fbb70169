"""The worker's start-up lines on UCX and device memory: which protocol each direction takes
(:mod:`moriio.adapters.nixl.protocols`), a READ by software emulation as a warning."""

from __future__ import annotations

from collections.abc import Callable

import torch

from moriio.adapters.nixl import NixlTransferEngine
from moriio.adapters.nixl.protocols import (
    DirectionProtocols,
    probe_device_protocols,
    protocol_advice,
)
from moriio.log import get_logger
from moriio.ports import TransferEngineError

log = get_logger("moriio.vllm")


def device_scratch(device: torch.device) -> Callable[[int], tuple[int, int, object]]:
    """Device memory for a probe: (address, device id, the tensor that keeps it)."""

    def scratch(nbytes: int) -> tuple[int, int, object]:
        tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        return tensor.data_ptr(), tensor.device.index or 0, tensor

    return scratch


def probe_device(device: torch.device) -> list[DirectionProtocols]:
    return probe_device_protocols(device_scratch(device), NixlTransferEngine)


def log_device_protocols(device: torch.device) -> None:
    """One line per direction; a failed probe is one warning, never an error."""
    try:
        found = probe_device(device)
    except (TransferEngineError, RuntimeError, OSError, ImportError) as exc:
        log.warning("UCX protocol probe for device memory failed", reason=str(exc))
        return
    for direction in found:
        level, message = protocol_advice(direction)
        (log.warning if level == "warning" else log.info)(message, device=str(device))
