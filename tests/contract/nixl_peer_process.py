"""A NIXL engine in its own process, so a test can kill it: ``python nixl_peer_process.py N``.

Registers N bytes holding ``arange(N) % 251``, prints ``METADATA <hex>`` and
``DESCRIPTOR <hex>`` lines, then drives progress until stdin closes or the process is killed.
"""

from __future__ import annotations

import select
import sys

import numpy as np

from moriio.adapters.nixl import NixlTransferEngine


def main() -> None:
    size = int(sys.argv[1])
    buffer = (np.arange(size) % 251).astype(np.uint8)
    engine = NixlTransferEngine(loopback=True)
    region = engine.register_region(buffer.ctypes.data, buffer.nbytes)
    print("METADATA", engine.metadata().hex(), flush=True)
    print("DESCRIPTOR", region.descriptor.hex(), flush=True)
    while True:
        engine.progress()
        ready, _, _ = select.select([sys.stdin], [], [], 0.001)
        if ready and not sys.stdin.readline():
            break
    engine.close()


if __name__ == "__main__":
    main()
