"""The prefill's first token, streamed to the client as soon as the prefill answers.

vLLM's P/D drops the token the prefill sampled: the decode computes the prompt's last token
again and samples the same first token, one step after the KV landed. With
``--first-token-ahead`` the router sends the client the prefill's token at once, then
relays the decode's stream without its first token (WRITE, whose legs leave together: only
when the prefill's answer comes before the decode's first bytes). Only requests whose first
token the decode must repeat are eligible: streamed, greedy (``temperature`` 0) or seeded,
one choice, no logprobs, echo or stop strings, plain text. Every such stream is checked: the
decode's first token must equal the prefill's (its text, and its id when the client asked for
ids); when it does not, the client gets an error event and the stream ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

CHAT_PATH = "/v1/chat/completions"
EVENT_END = b"\n\n"
DATA = b"data: "
MAX_PENDING_BYTES = 1 << 20  # of the decode's stream held while looking for its first token


class FirstTokenMismatchError(Exception):
    """The decode's first token differs from the prefill's, which the client already has."""


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The prefill's first token: what the client gets first, and what the decode repeats."""

    chat: bool
    text: str
    token_ids: tuple[int, ...] | None  # None: the client did not ask for token ids
    events: bytes  # the server-sent events that carry it, as vLLM would stream them


def first_token(path: str, body: Mapping[str, Any], answer: object) -> FirstToken | None:
    """The token to send ahead for a client's ``body`` on ``path``, given the prefill's
    non-streamed ``answer``; None when the request or the answer is not eligible."""
    if not _eligible_request(body) or not isinstance(answer, dict):
        return None
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason") != "length":
        return None  # the prefill stopped on its own: so will the decode, nothing to gain
    chat = path == CHAT_PATH
    text = _chat_text(choice) if chat else choice.get("text")
    if not isinstance(text, str) or not text:
        return None
    ids = None
    if body.get("return_token_ids"):
        raw = choice.get("token_ids")
        if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], int):
            return None
        ids = (raw[0],)
    head = {key: answer.get(key) for key in ("id", "created", "model")}
    if chat:
        message = choice["message"]
        events = [
            _chat_chunk(head, {"role": message.get("role", "assistant"), "content": ""}),
            _chat_chunk(head, {"content": text}, ids),
        ]
    else:
        events = [_completion_chunk(head, text, ids, choice.get("prompt_token_ids"))]
    return FirstToken(chat, text, ids, b"".join(_event(e) for e in events))


def _eligible_request(body: Mapping[str, Any]) -> bool:
    """Streamed, one choice, deterministic first token, nothing the token must not skip."""
    if body.get("stream") is not True:
        return False
    temperature, seed = body.get("temperature"), body.get("seed")
    greedy = isinstance(temperature, int | float) and temperature == 0
    if not greedy and not isinstance(seed, int):
        return False
    if body.get("n", 1) != 1 or body.get("best_of", 1) not in (1, None):
        return False
    if body.get("echo") or body.get("logprobs") or body.get("top_logprobs"):
        return False
    if body.get("stop") or body.get("tools") or body.get("prompt_logprobs"):
        return False
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        return False
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return limit is None or (isinstance(limit, int) and limit > 1)


def _chat_text(choice: Mapping[str, Any]) -> str | None:
    message = choice.get("message")
    if not isinstance(message, dict):
        return None
    if message.get("tool_calls") or message.get("reasoning") or message.get("reasoning_content"):
        return None
    content = message.get("content")
    return content if isinstance(content, str) else None


def _completion_chunk(
    head: Mapping[str, Any], text: str, ids: tuple[int, ...] | None, prompt_ids: object
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
    }
    if ids is not None:
        choice["prompt_token_ids"] = prompt_ids if isinstance(prompt_ids, list) else None
        choice["token_ids"] = list(ids)
    return {**head, "object": "text_completion", "choices": [choice]}


def _chat_chunk(
    head: Mapping[str, Any], delta: dict[str, Any], ids: tuple[int, ...] | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = list(ids)
    return {**head, "object": "chat.completion.chunk", "choices": [choice]}


def _event(payload: Mapping[str, Any]) -> bytes:
    return DATA + json.dumps(payload, separators=(",", ":")).encode() + EVENT_END


async def ahead_of(
    prefill_call: Awaitable[tuple[int, Any]], path: str, body: Mapping[str, Any]
) -> FirstToken | None:
    """WRITE: the prefill's first token once it answered (None: it failed, or its token does
    not qualify)."""
    status, answer = await prefill_call
    return first_token(path, body, answer) if status == 200 else None


async def first_of(
    content: aiohttp.StreamReader, ahead: asyncio.Future[FirstToken | None]
) -> tuple[asyncio.Future[bytes], FirstToken | None]:
    """WRITE, whichever comes first: the decode's first bytes (then nothing goes ahead) or the
    prefill's token. Returns the read of the decode's first bytes (done or not) and the token
    to send before them, if any."""
    read = asyncio.ensure_future(content.readany())
    try:
        await asyncio.wait((read, ahead), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        read.cancel()
        raise
    if read.done() or ahead.cancelled() or ahead.exception() is not None:
        return read, None
    return read, ahead.result()


async def decode_chunks(
    first: asyncio.Future[bytes] | None, content: aiohttp.StreamReader
) -> AsyncIterator[bytes]:
    """The decode's stream as it comes: ``first`` (a read already started), then the rest."""
    if first is not None:
        chunk = await first
        if not chunk:
            return
        yield chunk
    async for chunk in content.iter_any():
        yield chunk


async def open_stream(request: web.Request, first: FirstToken) -> web.StreamResponse:
    """The client's stream, opened with the prefill's first token."""
    out = web.StreamResponse(status=200)
    out.content_type = "text/event-stream"
    await out.prepare(request)
    await out.write(first.events)
    return out


def error_event(message: str) -> bytes:
    """The error event (and end of stream) a client gets once its stream was opened with the
    prefill's token: the decode failed, or its first token was another."""
    error = {"message": message, "type": "BadGateway", "code": 502}
    return _event({"error": error}) + DATA + b"[DONE]" + EVENT_END


class DecodeStream:
    """Takes the decode's first token out of its stream, once; then passes bytes as they
    come. Raises :class:`FirstTokenMismatchError` when that token is not the prefill's."""

    def __init__(self, first: FirstToken) -> None:
        self._first = first
        self._text = first.text  # still to find at the start of the decode's text
        self._ids = list(first.token_ids) if first.token_ids is not None else None
        self._buffer = b""
        self._key = "content" if first.chat else "text"  # where a chunk's text is
        self.passing = False  # the first token was found: the rest is relayed unchanged

    def feed(self, chunk: bytes) -> bytes:
        """What to send the client for ``chunk`` of the decode's stream."""
        if self.passing:
            return chunk
        self._buffer += chunk
        if len(self._buffer) > MAX_PENDING_BYTES and EVENT_END not in self._buffer:
            raise FirstTokenMismatchError(
                f"the decode sent over {MAX_PENDING_BYTES} bytes without ending an event"
            )
        out = []
        while not self._found():
            end = self._buffer.find(EVENT_END)
            if end < 0:
                break
            event, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
            out.append(self._rewrite(event))
        if self._found():
            self.passing = True
            out.append(self._buffer)
            self._buffer = b""
        return b"".join(out)

    def _found(self) -> bool:
        """Whether all of the first token was taken out of the decode's stream."""
        return not self._text and not self._ids

    def _rewrite(self, event: bytes) -> bytes:
        """``event`` with the first token's text (and id) taken out; b"" when nothing is
        left of it."""
        if not event.startswith(DATA + b"{"):
            return event
        try:
            payload = json.loads(event[len(DATA) :])
        except ValueError as exc:
            error = f"the decode sent an event that is not JSON: {exc}"
            raise FirstTokenMismatchError(error) from exc
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return event  # an error event or usage: not the token
        choice = choices[0]
        delta = choice.get("delta") if self._first.chat else choice
        if not isinstance(delta, dict):
            return event
        if self._first.chat and "role" in delta and not delta.get("content"):
            return b""  # the role was sent ahead
        text = delta.get(self._key) or ""
        ids = choice.get("token_ids")
        if not isinstance(text, str):
            raise FirstTokenMismatchError(f"the decode's first token is no text: {text!r}")
        if not text and not ids and choice.get("finish_reason") is None:
            return event  # carries nothing of the token
        self._check(text, ids, choice.get("finish_reason"))
        return self._strip(payload, choice, delta, text, ids)

    def _check(self, text: str, ids: object, finish: object) -> None:
        """Match ``text`` (and ``ids``) against what is left of the first token."""
        if not self._text.startswith(text) and not text.startswith(self._text):
            raise FirstTokenMismatchError(
                f"the decode's first token {text!r} is not the prefill's {self._first.text!r}"
            )
        if self._ids:
            got = ids if isinstance(ids, list) else []
            if not got or got[: len(self._ids)] != self._ids[: len(got)]:
                raise FirstTokenMismatchError(
                    f"the decode's first token ids {got} are not the prefill's {self._ids}"
                )
        if finish is not None and len(text) <= len(self._text):
            raise FirstTokenMismatchError("the decode stopped at the prefill's first token")

    def _strip(
        self,
        payload: dict[str, Any],
        choice: dict[str, Any],
        delta: dict[str, Any],
        text: str,
        ids: object,
    ) -> bytes:
        """Take what is left of the first token out of the event (already checked)."""
        taken = min(len(text), len(self._text))
        self._text = self._text[taken:]
        left = text[taken:]
        if self._ids is not None and isinstance(ids, list):
            dropped = min(len(ids), len(self._ids))
            self._ids = self._ids[dropped:]
            choice["token_ids"] = ids[dropped:]
        if not left and not choice.get("token_ids") and choice.get("finish_reason") is None:
            return b""
        delta[self._key] = left
        choice.pop("prompt_token_ids", None)
        return _event(payload)
