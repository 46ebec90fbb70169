"""Per-transfer capabilities: unguessable tokens that authorise control messages.

The side whose memory a transfer touches mints one (the producer in READ mode, handed out in
``kv_transfer_params``: there, the hand-off's check tag, see
:mod:`moriio.domain.params.handoff_tags`; the consumer in WRITE mode, sent in
``remote_blocks``: drawn here), and accepts
the messages that end the transfer (``release``; ``write_done``/``write_failed``) only when
they carry it. No shared secret is needed: only the router and the peer ever see a token.
"""

from __future__ import annotations

import os
import re
import secrets

TOKEN_BYTES = 16  # 128 bits
TOKENS_PER_DRAW = 64  # one call to the OS's generator mints this many (a hot path)
_TOKEN = re.compile(r"[0-9a-f]{32}")
_unused: list[str] = []  # drawn, never handed out; emptied in a forked child
os.register_at_fork(after_in_child=_unused.clear)


def new_token() -> str:
    """A fresh capability: 32 lowercase hex digits from the OS's secure generator.

    Drawn ``TOKENS_PER_DRAW`` at a time; each is handed out once (``list.pop`` is atomic), and
    a forked child never reuses its parent's draw.
    """
    try:
        return _unused.pop()
    except IndexError:
        digits = secrets.token_hex(TOKEN_BYTES * TOKENS_PER_DRAW)
        width = 2 * TOKEN_BYTES
        _unused.extend(digits[i : i + width] for i in range(width, len(digits), width))
        return digits[:width]


def is_token(value: str) -> bool:
    """Whether ``value`` is spelled as :func:`new_token` spells them."""
    return _TOKEN.fullmatch(value) is not None


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison (a timing side channel must not reveal a token's prefix)."""
    return secrets.compare_digest(given.encode(), expected.encode())
