"""Sleep and wake a simulated engine as vLLM 0.33 does (``EngineCore.sleep(level=1)`` then
``wake_up()``), with the released KV memory kept aside and poisoned so that a byte landing in
it afterwards is seen.

vLLM 0.33's order (``v1/engine/core.py``, ``v1/worker/gpu_worker.py``): the scheduler is
paused and its requests aborted; the worker calls ``unregister_kv_caches()``, then the sleep
backend releases the KV memory. On wake the memory is allocated again, the worker calls
``restore_kv_caches()``, and the engine core hands the workers' handshake metadata to the
scheduler's connector again before scheduling resumes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from support.pd.sim_engine import SimEngine
from support.pd.sim_proxy import PDProxy, Workload

RELEASED = 0xA5  # what released memory holds from the moment it is released
FRESH = 0x5A  # what memory allocated at the wake holds before anything is written


@dataclass
class Released:
    """The memory one sleep released: it must stay exactly as poisoned."""

    storages: list[torch.UntypedStorage] = field(default_factory=list)
    addresses: dict[str, int] = field(default_factory=dict)  # layer -> address before

    def untouched(self) -> bool:
        return all(bool(torch.all(_bytes(s) == RELEASED)) for s in self.storages)


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """Every byte of ``storage``, as a uint8 tensor viewing it."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def abort_all(proxy: PDProxy, engine: SimEngine) -> None:
    """``pause_scheduler(mode="abort")`` on ``engine``: every request it runs is aborted."""
    for key in list(proxy.transfer_ids):
        if key in proxy.done or key in proxy.abandoned:
            continue
        if engine is proxy.prefill and proxy.prefill_ids[key] in engine.scheduler.requests:
            proxy.abort_prefill(key)
        if engine is proxy.decode:
            proxy.abort_decode(key)


def retire_with_transfers_live(
    proxy: PDProxy, engine: SimEngine, live: Callable[[], bool], requests: Workload
) -> int:
    """Submit ``requests`` one per step and step the engines until ``live()``, then begin
    ``engine``'s ``unregister_kv_caches`` at once: its retirement (the hook's first phase;
    :func:`sleep` completes the hook). The engine's own progress thread is held off
    meanwhile, so that what the steps left in flight is still in flight when the retirement
    begins. Returns the transfers live then."""
    worker_side = engine.worker.worker_side
    assert worker_side is not None
    assert worker_side.progress is not None
    queue = list(reversed(requests.requests))
    with worker_side.progress.lock:
        for _ in range(len(queue) + 20):
            if live():
                break
            if queue:
                proxy.submit(*queue.pop())
            proxy.step_prefill()
            if live():
                break
            proxy.step_decode()
        assert live(), "no transfer was live when the sleep began"
        count = engine.service.num_live
        abort_all(proxy, engine)
        engine.service.retire()
    return count


def sleep(engine: SimEngine) -> Released:
    """The worker's ``sleep(level=1)``: unregister (or complete an unregister begun by
    :func:`retire_with_transfers_live`), then the KV memory is released."""
    engine.worker.unregister_kv_caches()
    released = Released()
    for name, tensor in engine.kv.items():
        storage = tensor.untyped_storage()
        released.addresses[name] = tensor.data_ptr()
        _bytes(storage).fill_(RELEASED)
        released.storages.append(storage)  # kept: no later allocation may reuse it
    return released


def wake(engine: SimEngine, released: Released) -> None:
    """The worker's ``wake_up()``: the KV memory allocated again at other addresses,
    ``restore_kv_caches()``, then the engine core's handshake metadata to the scheduler."""
    for name, tensor in engine.kv.items():
        fresh = torch.empty_like(tensor)
        _bytes(fresh.untyped_storage()).fill_(FRESH)
        tensor.set_(fresh.untyped_storage(), 0, tensor.shape, tensor.stride())
        assert tensor.data_ptr() != released.addresses[name]
    engine.worker.restore_kv_caches()
    engine.tell_scheduler_handshake_metadata()


def settle_and_clear_prefix_cache(proxy: PDProxy, engine: SimEngine) -> None:
    """Step until ``engine`` holds no block, then reset its prefix cache (level-1 sleep
    discarded the KV its cached blocks held)."""
    for _ in range(2000):
        if engine.free_blocks() == engine.num_blocks - 1 and not engine.busy():
            break
        proxy.step()
    assert engine.scheduler.reset_prefix_cache(), engine.leftovers()
