"""Per-transfer capabilities: unguessable tokens that authorise control messages.

The side whose memory a transfer touches mints one (the producer in READ mode, handed out in
``kv_transfer_params``; the consumer in WRITE mode, sent in ``remote_blocks``), and accepts
the messages that end the transfer (``release``; ``write_done``/``write_failed``) only when
they carry it. No shared secret is needed: only the router and the peer ever see a token.
"""

from __future__ import annotations

import re
import secrets

TOKEN_BYTES = 16  # 128 bits
_TOKEN = re.compile(r"[0-9a-f]{32}")


def new_token() -> str:
    """A fresh capability: 32 lowercase hex digits from the OS's secure generator."""
    return secrets.token_hex(TOKEN_BYTES)


def is_token(value: str) -> bool:
    """Whether ``value`` is spelled as :func:`new_token` spells them."""
    return _TOKEN.fullmatch(value) is not None


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison (a timing side channel must not reveal a token's prefix)."""
    return secrets.compare_digest(given.encode(), expected.encode())
