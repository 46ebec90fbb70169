"""Raw ZMQ DEALER sockets that send hand-made frames to a channel's listener."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import zmq

from moriio.ports import PeerAddress

Dealers = Callable[[PeerAddress], zmq.Socket[bytes]]


def raw_dealers() -> Iterator[Dealers]:
    """Body of a fixture: a function connecting a new DEALER to an address; all closed after."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def connect(address: PeerAddress) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{address.host}:{address.port}")
        return sock

    yield connect
    ctx.destroy(linger=0)
