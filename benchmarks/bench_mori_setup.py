"""Engine step time while a peer's mori sessions are built (mori stand-in, GIL held as mori does).

mori's ``CreateSession``, ``RegisterMemory``, ``CreateBackend`` and its constructor hold the
interpreter lock for their whole run; the stand-in holds it ``--hold`` seconds per call. A
stepping thread stands for vLLM's engine loop: each step runs ``--work`` seconds of Python and
then waits ``--gpu`` seconds with the lock released (the GPU running the forward). At step 10
it applies handshakes with ``--peers`` peers (``add_peer`` + ``import_region`` of each of their
``--regions`` memories), as the worker does.

* ``inline``: the step waits until the peers' sessions exist, as when ``import_region`` built
  them on the thread that applied the handshake (moriio before the connection thread).
* ``thread``: the step goes on; the adapter's connection thread builds them meanwhile.

Prints, per mode, the median step before the handshakes and the longest step from the
handshakes until every session exists, and the ratio of the two; then thread/inline. Run:
``.venv/bin/python benchmarks/bench_mori_setup.py [--hold S] [--gpu S] [--peers N]``.
The figures depend on the stand-in's hold time, not on real hardware.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from moriio.adapters.mori import MoriTransferEngine  # noqa: E402
from support.mori_stand_in import mori_stand_in  # noqa: E402

SIZE = 1 << 16


def _python_work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def run(
    mode: str, hold: float, gpu: float, work: float, peers: int, regions: int
) -> dict[str, float]:
    with mori_stand_in() as stand_in:
        a = MoriTransferEngine("a")
        mine = np.zeros(SIZE, np.uint8)
        a.register_region(mine.ctypes.data, SIZE)
        sides = []
        for i in range(peers):
            b = MoriTransferEngine(f"b{i}")
            bufs = [np.ones(SIZE, np.uint8) for _ in range(regions)]
            descriptors = [b.register_region(buf.ctypes.data, SIZE).descriptor for buf in bufs]
            sides.append((b, bufs, descriptors))
        stand_in.SETUP_GIL_SECONDS = hold
        steps: list[tuple[int, float]] = []
        built_at = [0]

        def step_loop() -> None:
            step = 0
            while True:
                start = time.perf_counter()
                if step == 10:
                    for b, _, descriptors in sides:
                        peer = a.add_peer(b.metadata())
                        for descriptor in descriptors:
                            a.import_region(peer, descriptor)
                    wait = getattr(a, "wait_for_connections", None)
                    if mode == "inline" and wait is not None:
                        wait(60.0)
                _python_work(work)
                time.sleep(gpu)
                steps.append((step, time.perf_counter() - start))
                step += 1
                idle = getattr(a, "wait_for_connections", lambda _: True)(0)
                if step > 10 and idle and not built_at[0]:
                    built_at[0] = step
                if built_at[0] and step >= built_at[0] + 10:
                    return

        thread = threading.Thread(target=step_loop)
        thread.start()
        thread.join()
        stand_in.SETUP_GIL_SECONDS = 0.0
        a.close()
        for b, _, _ in sides:
            b.close()
    before = statistics.median(d for s, d in steps if s < 10)
    during = max(d for s, d in steps if 10 <= s <= built_at[0])
    return {"before_ms": before * 1e3, "during_ms": during * 1e3, "ratio": during / before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=0.02, help="GIL hold per set-up call (s)")
    parser.add_argument("--gpu", type=float, default=0.03, help="GIL-free wait per step (s)")
    parser.add_argument("--work", type=float, default=0.002, help="Python work per step (s)")
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--regions", type=int, default=2, help="memories per peer")
    args = parser.parse_args()
    results = {
        mode: run(mode, args.hold, args.gpu, args.work, args.peers, args.regions)
        for mode in ("inline", "thread")
    }
    sessions = args.peers * args.regions
    print(
        f"{sessions} sessions, {args.hold * 1e3:.0f} ms GIL hold per set-up call, "
        f"steps of {args.work * 1e3:.1f} ms Python + {args.gpu * 1e3:.0f} ms GIL-free"
    )
    print(f"{'mode':<8}{'median step ms':>16}{'longest step ms':>17}{'longest/median':>16}")
    for mode, r in results.items():
        print(f"{mode:<8}{r['before_ms']:>16.1f}{r['during_ms']:>17.1f}{r['ratio']:>16.2f}")
    ratio = results["thread"]["during_ms"] / results["inline"]["during_ms"]
    print(f"longest step while sessions are built, thread / inline: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
