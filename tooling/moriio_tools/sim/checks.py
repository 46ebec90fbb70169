"""Checks run on a simulation's live nodes: pending buffers, nodes at rest, recovery."""

from __future__ import annotations

from collections.abc import Mapping

from moriio.domain.ledgers.release_ledger import DEFAULT_MAX_BUFFERED_ACKS
from moriio.domain.worker.producer.write_push_state import MAX_EARLY_BLOCKS
from moriio_tools.sim.invariants import (
    BufferReading,
    InvariantViolationError,
    Violation,
    check_all_free,
    check_buffers,
    check_listeners,
    violated,
)
from moriio_tools.sim.nodes import ConsumerNode, ProducerNode
from moriio_tools.sim.requests import Outcome
from moriio_tools.sim.workload import Workload


def check_pending_buffers(producer: ProducerNode | None, consumer: ConsumerNode | None) -> None:
    """Every buffer of messages waiting for their transfer stays within its bound."""
    bounds = {
        "early_remote_blocks": ("producer early remote_blocks", MAX_EARLY_BLOCKS),
        "buffered_releases": ("producer buffered releases", DEFAULT_MAX_BUFFERED_ACKS),
    }
    readings = []
    if producer is not None and producer.stack.service.producer is not None:
        for key, count in producer.stack.service.producer.pending_buffers.items():
            name, bound = bounds[key]
            readings.append(BufferReading(name, count, bound))
    for node in (producer, consumer):
        if node is not None:
            channel = node.stack.channel
            readings.append(
                BufferReading(f"{node.stack.name} inbox", channel.num_held, channel.plan.max_held)
            )
    check_buffers(readings)


def check_node_at_rest(node: ProducerNode | ConsumerNode) -> None:
    """After the run: every block free and untouched, the control listener alive."""
    check_all_free(node.pool)
    dirty = node.memory.dirty_blocks(node.pool.free_blocks())
    if dirty:
        raise violated(
            Violation.STRAY_WRITE,
            f"{node.stack.name}: free blocks {dirty[:8]} were written while free",
        )
    check_listeners({node.stack.name: node.stack.channel.listener_alive})


def recovery_finding(
    workload: Workload, outcomes: Mapping[int, Outcome]
) -> InvariantViolationError | None:
    """Requests sent after the faults stopped and the backlog drained must all load."""
    failed = sorted(
        uid
        for uid, outcome in outcomes.items()
        if workload.requests[uid].clean and outcome not in (Outcome.LOADED, Outcome.LOCAL_HIT)
    )
    if not failed:
        return None
    shown = [str(outcomes[uid]) for uid in failed[:8]]
    return violated(
        Violation.NO_RECOVERY,
        f"{len(failed)} request(s) sent after the faults stopped did not load: "
        f"uids {failed[:8]} ended {shown}",
    )
