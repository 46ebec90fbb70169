"""A moriio KV endpoint (NIXL engine + ZMQ control channel) for two-process tests.

Run as a script, it is the *peer* process::

    python transfer_peer.py --num-blocks 16 [--num-layers 32] [--seed 1]
                            [--dtype bfloat16] [--mode read]

It registers ``num_layers`` separated K/V bf16 layers ``[2, num_blocks, 16, 8, 128]`` filled
with :func:`pattern`, answers handshakes through :class:`PeerDirectory`, and serves until stdin
closes: every millisecond it drives NIXL progress (a target must poll, or wire-up stalls),
drains the control channel and reads commands. Protocol (one JSON object per line):

* stdout: ``{"event": "ready", "host", "port", "pid"}`` first, then one reply per command
  and one ``{"event": "wrote", ...}`` per finished write. C libraries' own prints are sent
  to stderr so that stdout carries only this protocol.
* stdin: ``{"cmd": "save", "transfer_id", "block_ids"}`` keeps the blocks a later
  ``RemoteBlocks`` of that transfer writes from (``first_block`` indexes into them): the
  peer handshakes with ``reply_to``, posts one WRITE per layer, then sends ``WriteDone`` or
  ``WriteFailed`` there. ``{"cmd": "connect", "host", "port"}`` handshakes with a peer.
  ``{"cmd": "digest"}`` answers the SHA-256 of every layer's bytes; ``{"cmd": "stats"}``
  the handshake counters. ``{"cmd": "pause", "seconds"}`` answers ``paused``, then stops
  polling for that long (transfers that need this peer's progress stall meanwhile).

Imported (``support.transfer_peer``), it gives tests the same building blocks:
:class:`KvSide`, :func:`pattern`, :func:`block_view`, :func:`digest` and :class:`PeerProcess`,
which starts and talks to the script.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from moriio.adapters.clock import SystemClock
from moriio.adapters.nixl import NixlTransferEngine
from moriio.adapters.zmq import ZmqControlChannel
from moriio.domain.kv.layout import LayerSpec
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import Message, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.domain.worker.peer_checks import PeerUnavailableError
from moriio.domain.worker.peers import PeerDirectory
from moriio.domain.worker.poster import Poster, PostRequest, PostResult
from moriio.ports import PeerAddress, TransferOp

HOST = "127.0.0.1"
MODEL = "moriio-two-process-model"
BLOCK_SIZE = 16
NUM_KV_HEADS = 8
HEAD_SIZE = 128
ITEMSIZE = 2  # bf16: numpy has no bfloat16, the bytes live in uint8 buffers
BLOCK_BYTES = BLOCK_SIZE * NUM_KV_HEADS * HEAD_SIZE * ITEMSIZE  # one K (or V) chunk: 32 KiB
SPEC = LayerSpec(BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, "attention")
POLL_S = 0.001
SCRIPT = Path(__file__).resolve()

Bytes = npt.NDArray[np.uint8]


def layer_shape(num_blocks: int) -> tuple[int, ...]:
    """Separated K/V layout: ``[2, num_blocks, block_size, num_kv_heads, head_size]``."""
    return (2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)


def layer_strides(num_blocks: int) -> tuple[int, ...]:
    """C-contiguous strides of :func:`layer_shape`, in elements."""
    shape = layer_shape(num_blocks)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def pattern(seed: int, layer: int, num_blocks: int) -> Bytes:
    """The seeded bytes of one layer (the same in every process)."""
    rng = np.random.default_rng([seed, layer])
    return np.frombuffer(rng.bytes(2 * num_blocks * BLOCK_BYTES), dtype=np.uint8).copy()


def block_view(buffer: Bytes, num_blocks: int) -> Bytes:
    """``buffer`` as ``[2 (K, V), num_blocks, BLOCK_BYTES]``."""
    return buffer.reshape(2, num_blocks, BLOCK_BYTES)


def digest(buffers: Sequence[Bytes]) -> str:
    """SHA-256 over every layer's bytes, in order."""
    h = hashlib.sha256()
    for buffer in buffers:
        h.update(buffer.data)
    return h.hexdigest()


def fingerprint(
    dtype: str, layout_kinds: tuple[str, ...], mode: TransferMode, model: str = MODEL
) -> Fingerprint:
    return Fingerprint(
        model_name=model,
        dtype=dtype,
        block_size=BLOCK_SIZE,
        layout_kinds=layout_kinds,
        tp_size=1,
        transfer_mode=mode,
        total_num_kv_heads=NUM_KV_HEADS,
        is_mla=False,
    )


@dataclass
class KvSide:
    """One worker's moriio pieces, wired the way the connector wires them."""

    engine: NixlTransferEngine
    channel: ZmqControlChannel[Message]
    kv: LocalKV
    peers: PeerDirectory
    poster: Poster
    buffers: list[Bytes]
    num_blocks: int
    fingerprint: Fingerprint
    closed: bool = False

    @classmethod
    def open(
        cls,
        *,
        num_layers: int,
        num_blocks: int,
        seed: int,
        dtype: str = "bfloat16",
        mode: TransferMode = TransferMode.READ,
        handshake_timeout: float = 5.0,
        transfer_timeout: float = 10.0,
    ) -> KvSide:
        buffers = [pattern(seed, i, num_blocks) for i in range(num_layers)]
        engine = NixlTransferEngine(host=HOST)
        try:
            kv = LocalKV.register(
                engine,
                [
                    LayerTensor(
                        name=f"model.layers.{i}.self_attn.attn",
                        addr=buffer.ctypes.data,
                        shape=layer_shape(num_blocks),
                        strides=layer_strides(num_blocks),
                        itemsize=ITEMSIZE,
                        dtype=dtype,
                        spec=SPEC,
                    )
                    for i, buffer in enumerate(buffers)
                ],
            )
            channel: ZmqControlChannel[Message] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
        except BaseException:
            engine.close()
            raise
        clock = SystemClock()
        fp = fingerprint(dtype, kv.layout_kinds, mode)
        peers = PeerDirectory(
            engine=engine,
            channel=channel,
            local=kv,
            fingerprint=fp,
            control=channel.address,
            dp_rank=0,
            tp_rank=0,
            instance_id=f"transfer-peer-{os.getpid()}",
            clock=clock,
            handshake_timeout=handshake_timeout,
        )
        channel.serve(peers.respond)
        poster = Poster(engine, clock, TransferPolicy(transfer_timeout=transfer_timeout))
        return cls(engine, channel, kv, peers, poster, buffers, num_blocks, fp)

    def posts(
        self,
        transfer_id: str,
        op: TransferOp,
        address: PeerAddress,
        local_block_ids: Sequence[int],
        remote_block_ids: Sequence[int],
    ) -> tuple[list[PostRequest], PlanCache]:
        """One batch per layer towards the peer at ``address`` (handshaking if needed)."""
        peer = self.peers.connect(address)
        num_blocks = {remote.num_blocks for remote in peer.layers.values()}
        if len(num_blocks) != 1:
            raise ValueError(f"peer layers disagree on num_blocks: {sorted(num_blocks)}")
        cache = PlanCache(local_block_ids, remote_block_ids, num_blocks.pop())
        requests = [
            PostRequest(
                transfer_id,
                layer.name,
                op,
                layer.region,
                peer.layers[layer.name].region,
                cache.plan_for(layer.geometry),
            )
            for layer in self.kv
        ]
        return requests, cache

    def run(self, requests: Sequence[PostRequest], timeout: float) -> list[PostResult]:
        """Submit ``requests`` and poll until each is terminal (or ``timeout`` passes)."""
        for request in requests:
            self.poster.submit(request)
        results: list[PostResult] = []
        deadline = time.monotonic() + timeout
        while len(results) < len(requests) and time.monotonic() < deadline:
            self.poster.progress_engine()
            results.extend(self.poster.progress())
            if len(results) < len(requests):
                time.sleep(POLL_S)
        return results

    def close(self) -> None:
        """Release everything; a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        with contextlib.ExitStack() as stack:
            stack.callback(self.engine.close)
            stack.callback(self.kv.deregister, self.engine)
            stack.callback(self.channel.close)
            stack.callback(self.peers.close)


# ---------------------------------------------------------------------------- test side


class PeerProcess:
    """The script in a child process; every wait on it is bounded."""

    def __init__(self, *args: str, ready_timeout: float = 30.0) -> None:
        # Closed by stop(); a file, not a pipe, so a chatty peer never blocks on stderr.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            ready = self.expect("ready", ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.address = PeerAddress(str(ready["host"]), int(ready["port"]))
        self.pid = int(ready["pid"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def stderr_tail(self, limit: int = 4000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """The next stdout event, which must be ``event``; AssertionError otherwise."""
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"peer sent no {event!r} within {timeout} s; stderr:\n{self.stderr_tail()}"
            ) from None
        if item is None:
            raise AssertionError(
                f"peer exited (rc={self.proc.poll()}) before {event!r}; "
                f"stderr:\n{self.stderr_tail()}"
            )
        if item.get("event") != event:
            raise AssertionError(f"expected {event!r} from the peer, got {item}")
        return item

    def command(self, cmd: str, reply: str | None, timeout: float = 10.0, **kw: Any) -> Any:
        """Send one command; return its reply event (None when ``reply`` is None)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return None if reply is None else self.expect(reply, timeout)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Close stdin (the script's signal to exit) and wait; kill if it does not exit."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=timeout)
        self._stderr.close()
        return self.proc.returncode


# ---------------------------------------------------------------------------- peer side


@dataclass
class _Write:
    """A WRITE this peer performs into the announcer's blocks."""

    reply_to: PeerAddress
    pending: int
    token: str  # the announcement's capability, echoed in the verdict
    errors: list[str] = field(default_factory=list)


class _Peer:
    """The serving loop of the peer process."""

    def __init__(self, side: KvSide, out: IO[str]) -> None:
        self.side = side
        self.out = out
        self.saves: dict[str, list[int]] = {}
        self.writes: dict[str, _Write] = {}
        self.stdin_buffer = b""

    def emit(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()

    def serve(self) -> None:
        stdin = sys.stdin.fileno()
        while True:
            self.side.engine.progress()
            for result in self.side.poster.progress():
                self.on_result(result)
            for inbound in self.side.channel.drain():
                if isinstance(inbound.message, RemoteBlocks):
                    self.on_remote_blocks(inbound.message)
            ready, _, _ = select.select([stdin], [], [], POLL_S)
            if ready:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return
                self.stdin_buffer += chunk
                *lines, rest = self.stdin_buffer.split(b"\n")
                self.stdin_buffer = rest
                for line in lines:
                    if line.strip():
                        self.on_command(json.loads(line))

    def on_command(self, command: dict[str, Any]) -> None:
        cmd = command["cmd"]
        if cmd == "save":
            self.saves[str(command["transfer_id"])] = [int(b) for b in command["block_ids"]]
            self.emit("saved")
        elif cmd == "connect":
            try:
                self.side.peers.connect(PeerAddress(command["host"], int(command["port"])))
            except PeerUnavailableError as exc:
                self.emit("connect_failed", error=str(exc))
            else:
                self.emit("connected")
        elif cmd == "pause":
            self.emit("paused")
            time.sleep(float(command["seconds"]))  # no progress: a polled target stalls
            self.emit("resumed")
        elif cmd == "digest":
            self.emit("digest", sha256=digest(self.side.buffers))
        elif cmd == "stats":
            peers = self.side.peers
            self.emit(
                "stats",
                handshakes=peers.handshakes,
                handshake_failures=peers.handshake_failures,
                rejected_requests=peers.rejected_requests,
                channel_rejected=dict(self.side.channel.rejected),
            )
        else:
            self.emit("error", error=f"unknown command {cmd!r}")

    def on_remote_blocks(self, message: RemoteBlocks) -> None:
        tid = message.transfer_id
        saved = self.saves.pop(tid, None)
        reply_to = message.reply_to
        try:
            if saved is None:
                raise ValueError(f"no saved blocks for transfer {tid!r}")
            local = saved[message.first_block : message.first_block + len(message.block_ids)]
            if len(local) != len(message.block_ids):
                raise ValueError(f"{len(message.block_ids)} blocks announced, {len(local)} saved")
            reply_to = self.side.peers.connect(
                message.reply_to, message.consumer_instance_id
            ).control
            requests, _ = self.side.posts(
                tid, TransferOp.WRITE, message.reply_to, local, message.block_ids
            )
        except (PeerUnavailableError, ValueError) as exc:
            self.finish(tid, _Write(reply_to, 0, message.token, [str(exc)]))
            return
        self.writes[tid] = _Write(reply_to, len(requests), message.token)
        for request in requests:
            self.side.poster.submit(request)

    def on_result(self, result: PostResult) -> None:
        tid = result.request.transfer_id
        write = self.writes[tid]
        write.pending -= 1
        if not result.ok:
            write.errors.append(f"{result.request.layer}: {result.message}")
        if write.pending == 0:
            del self.writes[tid]
            self.finish(tid, write)

    def finish(self, tid: str, write: _Write) -> None:
        if write.errors:
            reason = "; ".join(write.errors)
            self.side.channel.send(write.reply_to, WriteFailed(tid, reason, write.token))
        else:
            self.side.channel.send(write.reply_to, WriteDone(tid, write.token))
        self.emit("wrote", transfer_id=tid, ok=not write.errors, errors=write.errors)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-layers", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--mode", choices=[m.value for m in TransferMode], default="read")
    args = parser.parse_args(argv)
    # Keep the protocol on the original stdout; anything native code prints goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    side = KvSide.open(
        num_layers=args.num_layers,
        num_blocks=args.num_blocks,
        seed=args.seed,
        dtype=args.dtype,
        mode=TransferMode(args.mode),
    )
    try:
        peer = _Peer(side, out)
        address = side.channel.address
        peer.emit("ready", host=address.host, port=address.port, pid=os.getpid())
        peer.serve()
    finally:
        side.close()


if __name__ == "__main__":
    main()
