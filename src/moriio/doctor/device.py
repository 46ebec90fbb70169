"""The accelerator, as the connector will use it: the layer barrier and the protocols UCX
takes for device memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from moriio.doctor.checks import Check, Status

if TYPE_CHECKING:
    from moriio.adapters.nixl.protocols import DirectionProtocols

GET_ZCOPY = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def get_zcopy_check(environ: Mapping[str, str]) -> Check:
    """Whether a READ of device memory may take cuda_ipc zero-copy (moriio sets it when unset)."""
    name = f"env {GET_ZCOPY}"
    value = environ.get(GET_ZCOPY)
    if value is None:
        return Check(name, Status.PASS, "unset: moriio sets y (device READs by cuda_ipc zero-copy)")
    if value.strip().lower() in {"y", "yes", "1", "on", "true"}:
        return Check(name, Status.PASS, f"{value!r}: device READs by cuda_ipc zero-copy")
    return Check(
        name,
        Status.WARN,
        f"{value!r}: without NVLink UCX reads device memory by software emulation over TCP "
        "(0.45 GB/s on an H200 instead of 160-900); unset it or set y",
    )


def layer_barrier_check(probe: Callable[[], str | None] | None) -> Check:
    """Where a layerwise READ's forward waits for each layer: on the device's stream (FULL
    CUDA graphs capture it) or on the host. ``probe``: None without a CUDA/ROCm device,
    else a call returning None where the device can wait on gates, or why it cannot."""
    name = "layer barrier"
    if probe is None:
        return Check(name, Status.PASS, "no CUDA or ROCm device: KV in host memory, host waits")
    reason = probe()
    if reason is not None:
        return Check(
            name,
            Status.WARN,
            f"host waits; batches replaying FULL CUDA graphs load before the forward: {reason}",
        )
    return Check(name, Status.PASS, "device stream waits on per-layer gates (graphs capture them)")


def ucx_protocol_checks(probe: Callable[[], list[DirectionProtocols]] | None) -> list[Check]:
    """Which protocol UCX takes for device memory per direction (a probe moving one block
    each way in this process, UCX's tables captured). ``probe``: None without a GPU or
    without NIXL."""
    if probe is None:
        return [
            Check("UCX device protocols", Status.PASS, "no GPU with NIXL here: nothing to probe")
        ]
    try:
        found = probe()
    except (RuntimeError, OSError, ImportError) as exc:
        return [Check("UCX device protocols", Status.WARN, f"the probe failed: {exc}")]
    from moriio.adapters.nixl.protocols import protocol_advice  # imports the adapter's logging

    checks = []
    for direction in found:
        level, message = protocol_advice(direction)
        status = Status.WARN if level == "warning" else Status.PASS
        checks.append(Check(f"UCX device {direction.direction}", status, message))
    return checks
