"""Routes requests across a prefill and a decode engine the way a P/D proxy does.

Like vLLM's MoRIIO toy proxy: a ``transfer_id`` is minted per request; the prefill runs
with ``max_tokens=1`` and ``do_remote_decode``.

* READ (decode pulls): serial per request. The decode request is sent once the prefill
  returned its ``kv_transfer_params`` (block ids, address, lease), passed on unchanged.
* WRITE (prefill pushes): prefill and decode are dispatched together. The prefill gets the
  decode engine's address (``remote_host`` / ``remote_handshake_port`` /
  ``remote_notify_port``), the decode gets the prefill's and ``do_remote_prefill``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from moriio_tools.harness import EngineProcess, Finished, Submit
from support.pd.routing import (
    Address,
    new_transfer_id,
    prefill_params,
    write_decode_params,
)


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    key: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(slots=True)
class RouteResult:
    key: str
    transfer_id: str
    prefill_tokens: tuple[int, ...] | None = None
    decode_tokens: tuple[int, ...] | None = None
    error: str | None = None
    started: float = 0.0
    latency_s: float = 0.0  # dispatch to the decode output

    @property
    def done(self) -> bool:
        return self.error is not None or self.decode_tokens is not None


class ProcessProxy:
    """Dispatches waves of requests to a prefill and a decode engine process."""

    def __init__(
        self,
        prefill: EngineProcess,
        decode: EngineProcess,
        *,
        read_mode: bool,
        prefill_address: Address,
        decode_address: Address,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        self.read_mode = read_mode
        self.prefill_address = prefill_address
        self.decode_address = decode_address

    def run_wave(
        self,
        requests: Sequence[RoutedRequest],
        *,
        timeout_s: float,
        on_done: Callable[[RouteResult], None] | None = None,
    ) -> list[RouteResult]:
        """Run ``requests`` concurrently; returns when every one finished or failed."""
        results = {r.key: RouteResult(r.key, new_transfer_id()) for r in requests}
        by_key = {r.key: r for r in requests}
        now = time.monotonic()
        prefill: list[Submit] = []
        decode: list[Submit] = []
        for request in requests:
            result = results[request.key]
            result.started = now
            prefill.append(self.prefill_submit(request, result.transfer_id))
            if not self.read_mode:
                decode.append(self.decode_submit(request, result.transfer_id))
        self.prefill.submit(prefill)
        self.decode.submit(decode)
        deadline = now + timeout_s
        pending = set(results)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                for key in pending:
                    results[key].error = f"no decode output within {timeout_s:.0f} s"
                    if on_done is not None:
                        on_done(results[key])
                break
            wait([self.prefill.connection, self.decode.connection], timeout=min(left, 0.5))
            self.prefill.pump()
            self.decode.pump()
            forward: list[Submit] = []
            for finished in self.prefill.take_finished():
                result = results[finished.key.removeprefix("p-")]
                result.prefill_tokens = finished.token_ids
                if self.read_mode:
                    submit = self._forward(by_key[result.key], finished, result)
                    if submit is not None:
                        forward.append(submit)
            self.decode.submit(forward)
            for finished in self.decode.take_finished():
                result = results[finished.key.removeprefix("d-")]
                result.decode_tokens = finished.token_ids
                result.latency_s = time.monotonic() - result.started
            for key in [k for k in pending if results[k].done]:
                pending.discard(key)
                if on_done is not None:
                    on_done(results[key])
        return [results[r.key] for r in requests]

    def _forward(
        self, request: RoutedRequest, finished: Finished, result: RouteResult
    ) -> Submit | None:
        params = finished.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            result.error = f"prefill returned no transfer parameters ({finished.finish_reason})"
            return None
        if params.get("transfer_id") != result.transfer_id:
            result.error = f"prefill returned transfer_id {params.get('transfer_id')!r}"
            return None
        return self.decode_submit(request, result.transfer_id, params)

    def prefill_submit(self, request: RoutedRequest, transfer_id: str) -> Submit:
        """The prefill half of ``request`` (key ``p-<key>``, one token, ``do_remote_decode``)."""
        return Submit(
            f"p-{request.key}",
            request.prompt,
            1,
            prefill_params(transfer_id, None if self.read_mode else self.decode_address),
        )

    def decode_submit(
        self,
        request: RoutedRequest,
        transfer_id: str,
        returned: Mapping[str, Any] | None = None,
    ) -> Submit:
        """The decode half of ``request`` (key ``d-<key>``).

        READ: ``returned`` is what the prefill returned, passed on unchanged (required).
        WRITE: the parameters point at the prefill engine (``returned`` is ignored).
        """
        if self.read_mode:
            if returned is None:
                raise ValueError("READ mode: the decode request needs the prefill's parameters")
            params = dict(returned)
        else:
            params = write_decode_params(transfer_id, self.prefill_address)
        return Submit(f"d-{request.key}", request.prompt, request.max_tokens, params)
