"""The router heartbeat's own process: ``python -m moriio.vllm_plugin.beat ENDPOINT INTERVAL HEX``.

Sends the msgpack announcement (``HEX``) to the router's ping port every ``INTERVAL`` seconds
until its standard input closes (the engine stopped it, or died), writing one line per
beat: ``s`` sent, ``d`` dropped. A process of its own keeps beating while the engine's
interpreter is held in a long native call, which a thread of the engine could not.
Imports only the standard library and pyzmq, so it starts in a fraction of a second.
"""

from __future__ import annotations

import sys
import threading

import zmq

SEND_TIMEOUT_MS = 1000


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m moriio.vllm_plugin.beat ENDPOINT INTERVAL HEX", file=sys.stderr)
        return 2
    endpoint, interval, payload = argv[1], float(argv[2]), bytes.fromhex(argv[3])
    stop = threading.Event()

    def watch_parent() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the engine closed the pipe or is gone
        stop.set()

    threading.Thread(target=watch_parent, name="moriio-beat-parent", daemon=True).start()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    try:
        sock.connect(endpoint)
        while not stop.is_set():
            try:
                sock.send(payload)
                mark = "s\n"
            except zmq.ZMQError:
                mark = "d\n"
            try:
                sys.stdout.write(mark)
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                return 0  # nobody reads the beats any more: the engine is gone
            stop.wait(interval)
    finally:
        sock.close()
        context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
