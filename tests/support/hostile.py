"""What the hostile-input suites share: a P/D pair over real NIXL, raw frames on the wire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import zmq

from moriio.adapters.zmq import framing
from moriio.adapters.zmq.framing import Envelope, Kind
from moriio.ports import PeerAddress
from support.pd.sim_proxy import PDProxy, build_pd
from support.pd.worlds import NixlWorld


def nixl_pd(read_mode: bool, *, num_blocks: int, extra: dict[str, Any]) -> Iterator[PDProxy]:
    """A prefill and a decode engine over real NIXL and ZMQ, for a module-scoped fixture."""
    world = NixlWorld()
    proxy = build_pd(world, read_mode, num_blocks=num_blocks, extra=extra)
    yield proxy
    world.close()
    proxy.close()


def send_raw(to: PeerAddress, body: dict[str, Any]) -> None:
    """One unsigned frame carrying ``body`` as it is (no codec on the sending side)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(f"tcp://{to.host}:{to.port}")
        sock.send_multipart(framing.encode(Envelope(Kind.MESSAGE, 0, None, body), None))
    finally:
        sock.close(linger=1000)
        ctx.term()
