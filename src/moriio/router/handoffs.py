"""``moriio router``: give a prefill's hand-off back when no decode will ever load it.

A prefill holds a finished request's blocks until its decode releases them, the decode's
liveness probes stop, or the lease ends. A decode that never received the request (the
router could not reach it) can do none of that, so the router sends the release itself:

* READ, only when the decode refused the connection (the request never reached it) or is
  gone (its port refuses connections after the leg broke): a live decode that received the
  request may be reading the blocks, and releases them itself. The release carries the
  capability the prefill returned, as a consumer's would.
* WRITE, whenever the decode leg failed: without the decode's capability the release only
  cancels a transfer no decode announced blocks for yet; one that did is bound to that
  decode's capability, and the prefill refuses the router's release.

Releases go only to the registered prefill's own host, over a control channel the router is
given (the ``moriio router`` command opens a ZMQ one). An engine with a shared secret refuses
them (the router holds no secret): its hand-offs end at the lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from moriio.domain.params.transfer_params import (
    TransferParamsError,
    parse_transfer_params,
    port_offset,
)
from moriio.domain.protocol.messages import Message, Release
from moriio.domain.values.hosts import InvalidHostError, canonical_host
from moriio.log import get_logger
from moriio.ports import ControlChannel, ControlChannelError, PeerAddress
from moriio.router.registry import Instance

log = get_logger("moriio.router")

GONE_CHECK_DELAY_S = 0.5  # after a broken decode leg, before asking whether it is gone


class HandoffReturns:
    """Releases for hand-offs whose decode leg failed (see the module docstring)."""

    def __init__(self, open_channel: Callable[[], ControlChannel[Message]] | None) -> None:
        """``open_channel``: opens the channel releases go out on, at the first one; None:
        nothing is given back."""
        self._open_channel = open_channel
        self._channel: ControlChannel[Message] | None = None
        self.sent = 0

    def give_back(self, prefill: Instance, decode_params: Mapping[str, Any], dp_rank: int) -> None:
        """Release, on every TP rank of ``prefill``'s DP rank ``dp_rank``, the transfer that
        ``decode_params`` (the decode leg's ``kv_transfer_params``) name."""
        if self._open_channel is None:
            log.warning("hand-off not given back: no release channel", host=prefill.host)
            return
        try:
            params = parse_transfer_params(decode_params, "router", producer_peer=False)
            host = canonical_host(prefill.host)
        except (TransferParamsError, InvalidHostError) as exc:
            log.warning("hand-off not given back: unusable params", reason=str(exc))
            return
        if params is None or params.peer is None or canonical_host(params.peer.host) != host:
            log.warning("hand-off not given back: params name another host", host=prefill.host)
            return
        release = Release(params.transfer_id, 1, 0, params.token or "")
        tp_size = prefill.tp_size
        for rank in range(tp_size):
            port = prefill.notify_port + port_offset(dp_rank, rank, tp_size)
            self._send(PeerAddress(host, port), release)

    async def give_back_if_gone(
        self, decode: Instance, prefill: Instance, params: Mapping[str, Any], rank: int
    ) -> None:
        """READ: the decode leg broke after the decode got the request. Give the hand-off
        back only if the decode's server is gone (its port refuses connections a moment
        later): a live decode aborts the request itself, and releases once no read of it can
        still land."""
        await asyncio.sleep(GONE_CHECK_DELAY_S)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(decode.http_host, decode.http_port), GONE_CHECK_DELAY_S
            )
        except ConnectionRefusedError:
            self.give_back(prefill, params, rank)
        except (OSError, TimeoutError):
            pass  # not known to be gone: the lease ends it
        else:
            writer.close()

    def _send(self, to: PeerAddress, release: Release) -> None:
        try:
            if self._channel is None:
                assert self._open_channel is not None  # give_back checked
                self._channel = self._open_channel()
            self._channel.send(to, release)
        except (ControlChannelError, ValueError) as exc:
            log.warning("hand-off not given back", peer=str(to), reason=str(exc))
            return
        self.sent += 1
        log.info("hand-off given back", peer=str(to), transfer_id=release.transfer_id)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
