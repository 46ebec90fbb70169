"""A subclass of the connector keeps its overrides of the per-request scheduler hooks (the
base class binds them straight to its scheduler side, one frame per call)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from moriio.vllm_plugin import MoriioKVConnector
from moriio_tools.vllm_harness import make_kv_cache_config
from support.vllm_scheduler import make_vllm_config

pytestmark = pytest.mark.vllm


class _LoadsNothing(MoriioKVConnector):
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False


def _connector(cls: type[MoriioKVConnector]) -> MoriioKVConnector:
    config = make_vllm_config("kv_consumer", {"read_mode": True})
    return cls(config, KVConnectorRole.SCHEDULER, make_kv_cache_config(16))


def test_the_base_class_binds_the_hooks_to_its_scheduler_side() -> None:
    connector = _connector(MoriioKVConnector)
    side = connector.scheduler_side
    assert connector.get_num_new_matched_tokens == side.get_num_new_matched_tokens
    assert connector.update_state_after_alloc == side.update_state_after_alloc


def test_a_subclass_override_is_the_one_vllm_calls() -> None:
    connector = _connector(_LoadsNothing)
    assert connector.get_num_new_matched_tokens(object(), 0) == (0, False)
    side = connector.scheduler_side
    assert connector.get_num_new_matched_tokens != side.get_num_new_matched_tokens
    # the hooks it does not override are still bound to the scheduler side
    assert connector.update_state_after_alloc == side.update_state_after_alloc
