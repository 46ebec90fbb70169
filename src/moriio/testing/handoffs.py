"""Hand-offs as a prefill signs them, for tests of what a decode does with them.

:data:`PROMPT` is a prompt binding both sides of a test transfer share (a WRITE save and its
announcement; a READ hand-off and the request that loads it); :func:`signed_read` gives a
read order the check a decode's scheduler builds from genuine params, :func:`signed_params`
a decode request's params as a prefill returns them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from moriio.domain.kv.block_groups import as_groups
from moriio.domain.params.handoff_tags import (
    HandoffCheck,
    PromptBinding,
    encode_blocks,
    sign_handoff,
)
from moriio.domain.params.orders import ReadOrder


def prompt_binding(text: str = "a test prompt", num_tokens: int = 8) -> PromptBinding:
    """A binding of the ``tokens`` scheme, for a prompt named by ``text``."""
    return PromptBinding("tokens", num_tokens, hashlib.sha256(text.encode()).digest())


PROMPT = prompt_binding()
TEST_HANDOFF_KEY = hashlib.sha256(b"moriio test hand-off key").digest()
"""The key in-memory READ producer stacks sign with unless given another (tests only)."""


def signed_read(
    order: ReadOrder,
    instance_id: str = "producer#0",
    key: bytes = TEST_HANDOFF_KEY,
    *,
    engine_id: str = "p",
    prompt: PromptBinding = PROMPT,
    signed_prompt: PromptBinding | None = None,
    remote_groups: Sequence[Sequence[int]] | None = None,
) -> ReadOrder:
    """``order`` as a decode's scheduler builds it from params the producer instance
    ``instance_id`` signed with ``key``: for ``signed_prompt`` (default: ``prompt``, the
    loading request's own binding) over ``remote_groups`` (default: the order's remote
    blocks as one group). Its token is the signature's."""
    lease = order.lease_expires_at
    lease_ms = 0 if lease is None else int(lease * 1000)
    groups = remote_groups or (order.remote_block_ids,)
    blocks = encode_blocks(groups)
    assert blocks is not None
    signature = sign_handoff(
        key,
        transfer_id=order.transfer_id,
        engine_id=engine_id,
        instance_id=instance_id,
        lease_ms=lease_ms,
        blocks=blocks,
        prompt=signed_prompt or prompt,
    )
    check = HandoffCheck(order.transfer_id, engine_id, signature, groups, prompt)
    return order._replace(token=signature.check, handoff=check)


def signed_params(
    params: Mapping[str, Any],
    key: bytes,
    instance_id: str,
    prompt: PromptBinding = PROMPT,
    *,
    engine_id: str = "p",
    lease_expires_at: float | None = None,
) -> dict[str, Any]:
    """Decode-leg ``kv_transfer_params`` as a READ prefill instance signs them: ``params``
    (its ``remote_block_ids``, ``transfer_id``) with the signature in ``remote_engine_id``,
    and the lease (default: a minute from now on this host's clock)."""
    lease = time.time() + 60.0 if lease_expires_at is None else lease_expires_at
    lease_ms = int(lease * 1000)
    blocks = encode_blocks(as_groups(params.get("remote_block_ids") or ()))
    assert blocks is not None
    signature = sign_handoff(
        key,
        transfer_id=str(params["transfer_id"]),
        engine_id=engine_id,
        instance_id=instance_id,
        lease_ms=lease_ms,
        blocks=blocks,
        prompt=prompt,
    )
    return {
        **params,
        "remote_engine_id": f"{engine_id}#{signature.text()}",
        "lease_expires_at": lease_ms / 1000,
    }
