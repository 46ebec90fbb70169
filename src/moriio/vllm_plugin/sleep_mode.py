"""vLLM's sleep-mode hooks (0.33: ``unregister_kv_caches`` before the KV memory is released,
``restore_kv_caches`` after it is allocated again) on a worker's runtime.

Unregistering retires the registration (:mod:`moriio.domain.worker.sleep`): no post from then
on, every live transfer given up, the peers that hold our regions told; it returns once they
confirmed and nothing of ours is in flight, or at the retire deadline, and only then
deregisters the memory. Restoring registers the tensors again where they lie now, under the
next generation, and hands that generation to the scheduler through the handshake metadata
vLLM collects after a wake.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata

from moriio.container import WorkerRuntime
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.kv_registry import LayerTensor
from moriio.log import get_logger

log = get_logger("moriio.vllm")

RETIRE_POLL = 0.002  # seconds between looks at the drain while the progress thread pumps

Lock = Callable[[], AbstractContextManager[object]]


@dataclass
class MoriioHandshakeMetadata(KVConnectorHandshakeMetadata):
    """What a worker tells its engine's scheduler: the registration generation its KV memory
    is served under (named in the ``kv_transfer_params`` of every hand-off)."""

    registration_generation: int


def registration_generation(metadata: Iterable[KVConnectorHandshakeMetadata]) -> int | None:
    """The workers' registration generation (the ranks of one engine sleep and wake
    together; the highest wins), None when none told one."""
    generations = [
        m.registration_generation for m in metadata if isinstance(m, MoriioHandshakeMetadata)
    ]
    return max(generations) if generations else None


def unregister(runtime: WorkerRuntime, lock: Lock, policy: TransferPolicy) -> None:
    """Retire the registration, wait until no byte can land in (or be read from) the memory,
    then deregister it. Idempotent."""
    service = runtime.service
    with lock():
        if not service.sleep.asleep:
            service.retire()
        elif not service.ctx.kv.registered:
            return  # unregistered already
        deadline = policy.retire_deadline(service.ctx.clock.now())
    while True:
        with lock():
            if service.sleep.drained():
                break
            now = service.ctx.clock.now()
            if now >= deadline:
                log.warning(
                    "sleeping without every peer's confirmation: the retire deadline passed, "
                    "by which their own transfer and quarantine timeouts ended their batches",
                    unconfirmed=[str(p) for p in service.sleep.unconfirmed],
                    batches_in_flight=service.ctx.poster.num_inflight,
                )
                break
        time.sleep(RETIRE_POLL)  # the progress thread pumps and takes the confirmations in
    with lock():
        runtime.release_kv()
        log.info("KV cache unregistered for sleep", generation=service.ctx.peers.generation)


def restore(runtime: WorkerRuntime, lock: Lock, tensors: Sequence[LayerTensor]) -> None:
    """Register ``tensors`` (the KV cache where it lies after the wake) under the next
    generation. Does nothing unless the registration was retired."""
    with lock():
        if runtime.service.sleep.asleep:
            runtime.restore_kv(tensors)
