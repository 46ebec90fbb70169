"""The per-step metadata object vLLM ships from the scheduler to every worker."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from moriio.domain.wire.orders import StepOrders


class MoriioConnectorMetadata(KVConnectorMetadata):
    """Wraps this step's :class:`StepOrders` (deltas only; pickled by multi-process executors)."""

    def __init__(self, orders: StepOrders | None = None) -> None:
        self.orders = orders if orders is not None else StepOrders()
