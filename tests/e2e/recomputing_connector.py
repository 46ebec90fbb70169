"""Negative-control connector: the real moriio connector, but the decode loads nothing.

A decode engine using it matches the prefill's hand-off as ``MoriioKVConnector`` does, then
tells vLLM that no token can be loaded: vLLM computes the whole prompt itself, the
connector frees the prefill's blocks as for a full prefix-cache hit, and the answers equal
the baseline's. Only the decode's prompt-token sources show that nothing came over the
wire, which is what the engine tests' shared check (``support.prompt_kv``) must catch.
"""

from __future__ import annotations

from vllm.v1.request import Request

from moriio.vllm_plugin import MoriioKVConnector

CLASS_NAME = "RecomputingMoriioKVConnector"
MODULE_PATH = __name__


class RecomputingMoriioKVConnector(MoriioKVConnector):
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        super().get_num_new_matched_tokens(request, num_computed_tokens)
        return 0, False
