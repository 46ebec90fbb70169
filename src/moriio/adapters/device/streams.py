"""The worker's accelerator as torch exposes it (CUDA, ROCm/HIP, XPU): fences and binding.

Importing this module imports torch only (no vLLM), so tools that run without vLLM (the GPU
check) use the same code as the connector.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from moriio.ports import DeviceFence


def _backend(device_type: str) -> Any:
    """torch's per-device module (``torch.cuda`` also drives ROCm/HIP, ``torch.xpu``)."""
    module = getattr(torch, device_type, None)
    if module is None:
        raise ValueError(f"torch has no {device_type!r} backend")
    return module


def _current_stream(device: torch.device) -> Any:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_stream"):
        return accelerator.current_stream(device)
    return _backend(device.type).current_stream(device)


@dataclass(frozen=True, slots=True)
class TorchFence:
    """An event recorded on one stream; :meth:`is_complete` is ``event.query()``."""

    event: Any
    stream: Hashable

    def is_complete(self) -> bool:
        return bool(self.event.query())


class TorchFences:
    """Records an event on the calling thread's current stream of ``device``.

    Streams are told apart by (device, stream id): with two micro-batch streams each layer's
    fence is on the stream that computed it.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type == "cpu":
            raise ValueError("host memory has no streams: use no fences for the CPU")
        self._device = device
        self.recorded = 0

    def record(self) -> DeviceFence | None:
        stream = _current_stream(self._device)
        event = stream.record_event()
        self.recorded += 1
        key = (self._device.type, stream.device_index, stream.stream_id)
        return TorchFence(event, key)


def current_device() -> torch.device:
    """The accelerator the calling thread is bound to (the CPU when there is none)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        kind = accelerator.current_accelerator()
        return torch.device(kind.type, accelerator.current_device_index())
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and module.is_available():
            return torch.device(name, module.current_device())
    return torch.device("cpu")


def device_binder(device: torch.device) -> Callable[[], None] | None:
    """A call that binds the calling thread to ``device`` (None for the CPU).

    Threads do not inherit the device of the thread that started them: without it, a
    transport touched from a helper thread works on device 0's context.
    """
    if device.type == "cpu":
        return None
    index = 0 if device.index is None else device.index
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "set_device_index"):
        set_index: Callable[[int], None] = accelerator.set_device_index
    else:
        set_index = _backend(device.type).set_device

    def bind() -> None:
        set_index(index)

    return bind
