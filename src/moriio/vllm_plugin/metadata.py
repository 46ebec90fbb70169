"""The per-step metadata object vLLM ships from the scheduler to every worker."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from moriio.domain.params.orders import StepOrders


class MoriioConnectorMetadata(KVConnectorMetadata):
    """Wraps this step's :class:`StepOrders` (deltas only; pickled by multi-process executors).

    ``computes``: False when the step schedules no token, i.e. the scheduler only waits on
    transfers; such a step's workers may wait for one to finish (``idle_step_wait``).
    ``handoff_key``: the key the engine's scheduler signs READ hand-offs with (None: it
    signs none); its workers answer handshakes with it. It travels only between the
    engine's own processes."""

    def __init__(
        self,
        orders: StepOrders | None = None,
        *,
        computes: bool = True,
        handoff_key: bytes | None = None,
    ) -> None:
        self.orders = orders if orders is not None else StepOrders()
        self.computes = computes
        self.handoff_key = handoff_key
