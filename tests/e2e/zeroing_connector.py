"""Negative-control connector: the real moriio connector, but every loaded block is zeroed.

A decode engine using it receives the prefill's KV exactly like with ``MoriioKVConnector``
and then overwrites the received blocks with zeros before attention reads them:

* layerwise READ: in ``wait_for_layer_load``, after the layer's reads of this step completed;
* asynchronous READ and WRITE: in ``get_transfer_results``, for requests whose KV landed
  this step (their next forward reads the blocks).

Its outputs must differ from the single-engine baseline, which proves the end-to-end
comparison is sensitive to the transferred KV.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorTransferResults,
)

from moriio.domain.params.orders import ReadOrder
from moriio.vllm_plugin import MoriioKVConnector
from moriio.vllm_plugin.metadata import MoriioConnectorMetadata

CLASS_NAME = "ZeroingMoriioKVConnector"
MODULE_PATH = __name__


class ZeroingMoriioKVConnector(MoriioKVConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kv: dict[str, torch.Tensor] = {}
        self._reads: list[ReadOrder] = []
        self._loads: dict[str, tuple[int, ...]] = {}
        self.zeroed_blocks = 0

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = dict(kv_caches)
        super().register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._reads = []
        if isinstance(connector_metadata, MoriioConnectorMetadata):
            orders = connector_metadata.orders
            self._reads = list(orders.reads)
            for order in [*orders.reads, *orders.expect_writes]:
                self._loads[order.request_id] = order.local_block_ids

    def wait_for_layer_load(self, layer_name: str) -> None:
        super().wait_for_layer_load(layer_name)
        blocks = [b for order in self._reads for b in order.local_block_ids]
        self._zero([layer_name], blocks)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        results = super().get_transfer_results(finished_req_ids)
        loaded = set(results.finished_recving or ()) - set(results.failed_recving or ())
        blocks = [b for rid in loaded for b in self._loads.pop(rid, ())]
        self._zero(list(self._kv), blocks)
        return results

    def _zero(self, layers: list[str], blocks: list[int]) -> None:
        if not blocks:
            return
        index = torch.tensor(sorted(set(blocks)), dtype=torch.long)
        for layer in layers:
            self._kv[layer].index_fill_(0, index, 0.0)
        self.zeroed_blocks += len(index) * len(layers)
