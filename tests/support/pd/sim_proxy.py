"""A toy-proxy stand-in routing requests between two simulated engines, plus workloads.

The params it sends are the harness's (:mod:`support.pd.routing`); the engines are in-process
and stepped by the test.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.config.kv_transfer import KVRole

from moriio.domain.values.addresses import format_zmq_address
from moriio_tools.vllm_harness import BLOCK_SIZE
from support.pd.routing import (
    Address,
    connector_extra,
    new_transfer_id,
    prefill_params,
    write_decode_params,
)
from support.pd.sim_engine import SimEngine
from support.pd.worlds import World


def engine_extra(read_mode: bool, address: Address, **more: Any) -> dict[str, Any]:
    """:func:`~support.pd.routing.connector_extra` at ``address``, plus ``more``."""
    return {**connector_extra(read_mode, address), **more}


# Keys the toy proxy copies from the prefill's returned params into the decode request.
_ROUTER_COPIED = ("remote_engine_id", "remote_block_ids", "transfer_id")


class PDProxy:
    """Routes requests like vLLM's MoRIIO toy proxy: prefill with max_tokens=1, then decode.

    READ: the decode request is added once the prefill returned its params. WRITE: both are
    added at once. ``router_style`` sends what the toy proxy / vllm-router send: peer control
    addresses embedded in the request ids (with vLLM-style ``-<seq>-<hex>`` suffixes) and no
    ``remote_host``/ports in the params. Outcomes are keyed by the caller's request key.
    """

    def __init__(
        self,
        prefill: SimEngine,
        decode: SimEngine,
        read_mode: bool,
        prefill_address: Address,
        decode_address: Address,
        *,
        router_style: bool = False,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.read_mode = read_mode
        self.prefill_address = prefill_address
        self.decode_address = decode_address
        self.router_style = router_style
        self.pending: dict[str, tuple[str, list[int], int]] = {}  # P id -> (key, prompt, max)
        self.transfer_ids: dict[str, str] = {}  # key -> transfer id
        self.prefill_ids: dict[str, str] = {}  # key -> P request id
        self.decode_ids: dict[str, str] = {}  # key -> D request id
        self.done: dict[str, Any] = {}  # key -> the decode's final output
        self.prefill_done: dict[str, Any] = {}  # key -> the prefill's final output
        self.abandoned: set[str] = set()  # keys that will never reach ``done``
        self._key_of: dict[str, str] = {}  # D request id -> key

    # -- submitting ----------------------------------------------------------------------

    def submit(
        self, key: str, prompt: list[int], max_tokens: int, *, to_prefill: bool = True
    ) -> str:
        """Route one request; returns its transfer id. ``to_prefill=False`` (WRITE) never
        sends it to the prefill engine (a producer that never runs it)."""
        tid = new_transfer_id()
        self.transfer_ids[key] = tid
        p_id, d_id = self._request_ids(key)
        self.prefill_ids[key], self.decode_ids[key] = p_id, d_id
        self._key_of[d_id] = key
        # Router style: the peers' addresses travel in the request ids, not in the params.
        peers = not self.read_mode and not self.router_style
        p_params = prefill_params(tid, self.decode_address if peers else None)
        if not self.read_mode:
            d_params = write_decode_params(tid, self.prefill_address if peers else None)
            self.decode.add(d_id, prompt, max_tokens, d_params)
        if to_prefill:
            self.prefill.add(p_id, prompt, 1, p_params)
            self.pending[p_id] = (key, prompt, max_tokens)
        return tid

    def _request_ids(self, key: str) -> tuple[str, str]:
        if not self.router_style:
            return f"p-{key}", f"d-{key}"
        prefill, decode = self.prefill_address, self.decode_address
        p = format_zmq_address(prefill.host, prefill.handshake_port, prefill.notify_port)
        d = format_zmq_address(decode.host, decode.handshake_port, decode.notify_port)
        base = f"___prefill_addr_{p}___decode_addr_{d}_{uuid.uuid4().hex}"
        return f"{base}-0-{uuid.uuid4().hex[:8]}", f"{base}-1-{uuid.uuid4().hex[:8]}"

    def _decode_params(self, returned: dict[str, Any]) -> dict[str, Any]:
        if not self.router_style:
            return dict(returned)
        params = {k: returned.get(k) for k in _ROUTER_COPIED}
        params.update(
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_dp_size=returned.get("remote_dp_size", 1),
            remote_tp_size=returned.get("tp_size", 1),
        )
        return params

    # -- aborting ------------------------------------------------------------------------

    def abort_decode(self, key: str) -> None:
        """The client went away: abort the decode request (if it exists yet)."""
        self.abandoned.add(key)
        self.decode.abort([self.decode_ids[key]])

    def abort_prefill(self, key: str) -> None:
        """Abort the prefill request; READ: the decode request is then never sent."""
        p_id = self.prefill_ids[key]
        self.prefill.abort([p_id])
        if self.pending.pop(p_id, None) is not None and self.read_mode:
            self.abandoned.add(key)

    # -- stepping ------------------------------------------------------------------------

    def step_prefill(self) -> None:
        for output in self.prefill.step():
            entry = self.pending.pop(output.request_id, None)
            if entry is None:
                continue
            key, prompt, max_tokens = entry
            self.prefill_done[key] = output
            if not self.read_mode:
                continue
            if output.kv_transfer_params and key not in self.abandoned:
                params = self._decode_params(dict(output.kv_transfer_params))
                self.decode.add(self.decode_ids[key], prompt, max_tokens, params)
            else:
                self.abandoned.add(key)

    def step_decode(self) -> None:
        for output in self.decode.step():
            rid = output.request_id
            self.done[self._key_of.get(rid, rid)] = output  # requests added directly: by id

    def step(self) -> None:
        self.step_prefill()
        self.step_decode()

    def busy(self) -> bool:
        return bool(self.pending) or self.prefill.busy() or self.decode.busy()

    @property
    def in_flight(self) -> int:
        return len(self.transfer_ids) - len(self.done) - len(self.abandoned - self.done.keys())

    def run(self, max_steps: int = 10_000, pause: float = 0.0) -> int:
        """Step until both engines are idle; ``pause`` seconds between steps lets real-time
        deadlines pass in a bounded number of steps."""
        steps = 0
        while self.busy():
            self.step()
            steps += 1
            if steps >= max_steps:
                raise AssertionError(f"not done after {steps} steps: {self.describe()}")
            if pause:
                time.sleep(pause)
        return steps

    def leftovers(self) -> list[str]:
        """Everything either engine still holds or tracks; empty when both are quiescent."""
        problems = self.prefill.leftovers() + self.decode.leftovers()
        if self.pending:
            problems.append(f"proxy: {len(self.pending)} prefills pending")
        return problems

    def describe(self) -> str:
        return (
            f"pending={len(self.pending)} prefill_reqs={len(self.prefill.scheduler.requests)} "
            f"decode_reqs={len(self.decode.scheduler.requests)} leftovers={self.leftovers()}"
        )

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()


def build_pd(
    world: World,
    read_mode: bool,
    *,
    num_blocks: int = 1024,
    extra: dict[str, Any] | None = None,
    router_style: bool = False,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 1024,
    kv_load_failure_policy: str = "fail",
) -> PDProxy:
    """A prefill and a decode engine joined by ``world``; the world is started."""
    p_address, d_address = world.address(), world.address()
    sides: tuple[tuple[str, KVRole, Address], ...] = (
        ("P", "kv_producer", p_address),
        ("D", "kv_consumer", d_address),
    )
    engines = [
        SimEngine(
            name,
            role,
            engine_extra(read_mode, address, **(extra or {})),
            num_blocks=num_blocks,
            adapters_factory=world.adapters_factory,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_load_failure_policy=kv_load_failure_policy,
        )
        for name, role, address in sides
    ]
    world.start(engines)
    return PDProxy(
        engines[0], engines[1], read_mode, p_address, d_address, router_style=router_style
    )


# -- workloads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Requests to submit: (key, prompt, max_tokens)."""

    requests: tuple[tuple[str, list[int], int], ...]


def random_workload(
    seed: int,
    count: int,
    *,
    min_len: int = 5,
    max_len: int = 300,
    max_tokens: int = 4,
    repeat_fraction: float = 0.2,
    aligned_fraction: float = 0.15,
) -> Workload:
    """Random prompt lengths, some block-aligned, some one past a block, some repeated
    (prefix-cache hits on both engines)."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    requests = []
    for i in range(count):
        roll = rng.random()
        if prompts and roll < repeat_fraction:
            prompt = list(rng.choice(prompts))
        else:
            if roll < repeat_fraction + aligned_fraction:
                blocks = rng.randrange(1, max_len // BLOCK_SIZE + 1)
                length = blocks * BLOCK_SIZE + rng.choice((0, 1))
            else:
                length = rng.randrange(min_len, max_len + 1)
            prompt = [rng.randrange(1000) for _ in range(max(1, min(length, max_len)))]
            prompts.append(prompt)
        requests.append((str(i), prompt, rng.randrange(1, max_tokens + 1)))
    return Workload(tuple(requests))


def drive(
    proxy: PDProxy,
    workload: Workload,
    *,
    concurrency: int = 64,
    max_steps: int = 20_000,
    before_step: Callable[[int], None] | None = None,
) -> int:
    """Submit in waves keeping ``concurrency`` requests in flight; step until all ended."""
    queue = list(workload.requests)
    queue.reverse()
    steps = 0
    while queue or proxy.busy():
        while queue and proxy.in_flight < concurrency:
            key, prompt, max_tokens = queue.pop()
            proxy.submit(key, prompt, max_tokens)
        if before_step is not None:
            before_step(steps)
        proxy.step()
        steps += 1
        if steps >= max_steps:
            raise AssertionError(f"not done after {steps} steps: {proxy.describe()}")
    return steps
