"""The simulation's invariants: what must hold in every run, whatever faults were injected.

A broken invariant raises :class:`InvariantViolationError` naming its :class:`Violation` kind and
what was seen. The checks live in small helpers (block pools, deadline and buffer checks) so
tests can feed them deliberately broken scenarios.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from moriio.testing.stacks.memory import KVMemory


class Violation(enum.StrEnum):
    RELEASED_TWICE = "released_twice"  # a block set freed twice, or freed while not handed off
    NEVER_RELEASED = "never_released"  # a block set still allocated when the run ended
    PAST_DEADLINE = "past_deadline"  # a request pending past its deadline + one poll
    CORRUPT_KV = "corrupt_kv"  # a load reported success with bytes unlike the producer's
    STRAY_WRITE = "stray_write"  # a transfer wrote into a free block or a finished request
    UNEXPECTED_REPORT = "unexpected_report"  # a report about a request not in that state
    LATE_LOAD_ERROR = "late_load_error"  # load errors for blocks not loading in that step
    BUFFER_BOUND = "buffer_bound"  # a pending buffer beyond its bound
    LISTENER_DEAD = "listener_dead"  # a live worker's control listener stopped
    WORKER_LEAK = "worker_leak"  # worker state that never drained after the traffic stopped
    NO_OUTCOME = "no_outcome"  # a request that never reached a consumer-side outcome
    NO_RECOVERY = "no_recovery"  # a request sent after the faults stopped did not load
    CRASH = "crash"  # an exception escaped a worker or scheduler hook


class InvariantViolationError(AssertionError):
    """A broken simulation invariant; ``kind`` says which."""

    def __init__(self, kind: Violation, message: str) -> None:
        super().__init__(f"{kind.value}: {message}")
        self.kind = kind
        self.detail = message


def violated(kind: Violation, message: str) -> InvariantViolationError:
    return InvariantViolationError(kind, message)


def check_clean(memory: KVMemory, blocks: Sequence[int], node: str, rid: str) -> None:
    """Blocks just allocated to ``rid`` hold nothing a transfer wrote while they were free."""
    dirty = memory.dirty_blocks(blocks)
    if dirty:
        raise violated(
            Violation.STRAY_WRITE,
            f"{node}: free blocks {dirty} were written while free (found allocating {rid})",
        )


class BlockPool:
    """A node's KV blocks: a LIFO free list (freed blocks are reused first) and their owners.
    Block 0 is never handed out: like vLLM's null block, it holds no request's KV."""

    def __init__(self, node: str, num_blocks: int) -> None:
        self.node = node
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))
        self._owned: dict[str, tuple[int, ...]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_blocks(self) -> list[int]:
        return list(self._free)

    def owner_blocks(self, request_id: str) -> tuple[int, ...] | None:
        return self._owned.get(request_id)

    def owners(self) -> list[str]:
        return sorted(self._owned)

    def allocate(self, request_id: str, count: int) -> tuple[int, ...] | None:
        """``count`` free blocks for ``request_id`` (most recently freed first), or None."""
        if request_id in self._owned:
            raise violated(
                Violation.UNEXPECTED_REPORT, f"{self.node}: {request_id} allocated blocks twice"
            )
        if count > len(self._free):
            return None
        blocks = tuple(self._free[len(self._free) - count :][::-1])
        del self._free[len(self._free) - count :]
        self._owned[request_id] = blocks
        return blocks

    def free(self, request_id: str, why: str) -> tuple[int, ...]:
        """Return ``request_id``'s blocks to the pool; a second free is a violation."""
        blocks = self._owned.pop(request_id, None)
        if blocks is None:
            raise violated(
                Violation.RELEASED_TWICE,
                f"{self.node}: blocks of {request_id} freed ({why}) but it holds none: "
                "already released, or never allocated",
            )
        self._free.extend(reversed(blocks))
        return blocks


def check_deadline(what: str, since: float, budget: float, now: float, poll: float) -> None:
    """``what`` has been pending since ``since``: it must end by ``since + budget + poll``."""
    if now > since + budget + poll + 1e-9:
        raise violated(
            Violation.PAST_DEADLINE,
            f"{what} pending for {now - since:.4f} s, past its deadline of {budget:.4f} s "
            f"+ one poll ({poll:.4f} s)",
        )


@dataclass(frozen=True, slots=True)
class BufferReading:
    """One pending buffer: its name, how full it is, and its bound."""

    name: str
    size: int
    bound: int


def check_buffers(readings: Iterable[BufferReading]) -> None:
    for reading in readings:
        if reading.size > reading.bound:
            raise violated(
                Violation.BUFFER_BOUND,
                f"{reading.name} holds {reading.size} entries, over its bound {reading.bound}",
            )


def check_listeners(alive: Mapping[str, bool]) -> None:
    dead = sorted(name for name, ok in alive.items() if not ok)
    if dead:
        raise violated(Violation.LISTENER_DEAD, f"control listener dead on {', '.join(dead)}")


def check_all_free(pool: BlockPool) -> None:
    owners = pool.owners()
    if owners:
        shown = ", ".join(owners[:5]) + (", ..." if len(owners) > 5 else "")
        raise violated(
            Violation.NEVER_RELEASED,
            f"{pool.node}: {len(owners)} request(s) still hold blocks at the end: {shown}",
        )


def check_load_errors(invalid: Iterable[int], loading: Sequence[int], node: str) -> None:
    """Every reported load error names a block whose load ended in this very step."""
    late = sorted(set(invalid).difference(loading))
    if late:
        raise violated(
            Violation.LATE_LOAD_ERROR,
            f"{node}: load errors reported for blocks {late[:8]} that no request was loading "
            "in this step (a synchronous load must report its failure in its own step)",
        )
