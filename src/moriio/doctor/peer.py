"""``moriio doctor --peer``: handshake with a running peer, then a one-block READ.

The handshake is the connector's own (:class:`~moriio.domain.worker.peers.PeerDirectory`
semantics): a :class:`HandshakeRequest` carrying our fingerprint, engine metadata and a tiny
registered scratch layer goes to the peer's handshake port through
:meth:`ZmqControlChannel.request`; the peer answers with its details or rejects an
incompatible fingerprint. With a compatible peer, the first ``block_len`` bytes of the peer's
first layer (block 0; its K half for separated K/V layouts) are read into scratch memory and
their checksum printed.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moriio.doctor.checks import Check, Status, is_loopback
from moriio.doctor.fingerprints import (
    describe_fingerprint,
    diff_notes,
    fingerprint_dict,
    ours_vs_peer,
    parse_rejection,
)
from moriio.domain.kv.layout import LayerSpec
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
)
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.ports import (
    ControlChannel,
    ControlChannelError,
    LocalRegion,
    PeerAddress,
    RemoteRegion,
    RequestTimeoutError,
    TransferEngine,
    TransferEngineError,
    TransferOp,
    TransferState,
    TransferStatus,
)

SCRATCH_WIDTH = 16  # bytes per token of the scratch layer advertised in the handshake


@dataclass(slots=True)
class PeerReport:
    """What the peer checks found (the ``peer`` object of ``--json``)."""

    address: str
    checks: list[Check] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def scratch_kv(engine: TransferEngine, block_size: int) -> tuple[LocalKV, np.ndarray[Any, Any]]:
    """A one-block scratch layer (``[1, block_size, 16]`` bytes) registered with ``engine``."""
    buffer = np.zeros(block_size * SCRATCH_WIDTH, dtype=np.uint8)
    tensor = LayerTensor(
        name="doctor.scratch",
        addr=buffer.ctypes.data,
        shape=(1, block_size, SCRATCH_WIDTH),
        strides=(block_size * SCRATCH_WIDTH, SCRATCH_WIDTH, 1),
        itemsize=1,
        dtype="uint8",
        spec=LayerSpec(block_size, 1, SCRATCH_WIDTH, "mla"),
    )
    return LocalKV.register(engine, [tensor]), buffer


def make_engine(transport: str, peer: PeerAddress, bind_host: str) -> TransferEngine:
    name = f"moriio-doctor-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if transport == "mori":
        from moriio.adapters.mori import MoriTransferEngine

        return MoriTransferEngine(name, host=bind_host)
    from moriio.adapters.nixl import NixlTransferEngine

    return NixlTransferEngine(name, loopback=is_loopback(peer.host))


def _read_once(
    engine: TransferEngine,
    local: LocalRegion,
    remote: RemoteRegion,
    size: int,
    timeout: float,
) -> TransferStatus | None:
    """READ ``size`` bytes from offset 0, re-posting on backpressure; None on timeout."""
    zero = np.zeros(1, dtype=np.int64)
    sizes = np.array([size], dtype=np.int64)
    deadline = time.monotonic() + timeout
    while True:
        handle = engine.post(TransferOp.READ, local, remote, zero, zero, sizes, "doctor")
        try:
            while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
                if time.monotonic() > deadline:
                    return None
                engine.progress()
                time.sleep(0.0005)
        finally:
            engine.release(handle)
        if status.state is not TransferState.BACKPRESSURE or time.monotonic() > deadline:
            return status
        time.sleep(0.01)


def _read_block(
    engine: TransferEngine,
    layer: LayerRegions,
    reply: HandshakeReply,
    timeout: float,
    info: dict[str, Any],
) -> Check:
    """READ the first ``block_len`` bytes of ``layer`` into scratch memory; checksums go
    into ``info``."""
    size = layer.block_len
    peer_id = engine.add_peer(reply.engine_metadata)
    try:
        remote = engine.import_region(peer_id, layer.descriptors[0])
        if remote.length < size:
            return Check("round trip", Status.WARN, f"layer {layer.name!r} region is too short")
        scratch = np.full(size, 0xA5, dtype=np.uint8)
        region = engine.register_region(scratch.ctypes.data, size)
        try:
            start = time.monotonic()
            status = _read_once(engine, region, remote, size, timeout)
            elapsed_ms = (time.monotonic() - start) * 1000
        finally:
            engine.deregister_region(region)
    finally:
        engine.remove_peer(peer_id)
    if status is None:
        return Check("round trip", Status.FAIL, f"READ not done within {timeout:g} s")
    if status.state is not TransferState.SUCCEEDED:
        return Check(
            "round trip",
            Status.FAIL,
            f"READ of {size} B from layer {layer.name!r} {status.state.value}: {status.message}",
        )
    data = scratch.tobytes()
    info["crc32"] = f"{zlib.crc32(data):08x}"
    info["sha256"] = hashlib.sha256(data).hexdigest()
    info["elapsed_ms"] = elapsed_ms
    return Check(
        "round trip",
        Status.PASS,
        f"READ {size} B (block 0 of layer {layer.name!r}) in {elapsed_ms:.2f} ms",
        (f"crc32 {info['crc32']}  sha256 {info['sha256'][:32]}",),
    )


def _handshake(
    channel: ControlChannel[Message],
    request: HandshakeRequest,
    peer: PeerAddress,
    timeout: float,
    report: PeerReport,
) -> HandshakeReply | None:
    """Send the request; append the handshake check; the reply when transfers may follow."""
    ours = request.fingerprint
    try:
        reply = channel.request(peer, request, timeout)
    except RequestTimeoutError:
        report.checks.append(
            Check(
                f"handshake {peer}",
                Status.FAIL,
                f"no reply within {timeout:g} s: is this the peer's handshake port (not its "
                "notify port)? A shared-secret mismatch also looks like this",
            )
        )
        return None
    except ControlChannelError as exc:
        report.checks.append(Check(f"handshake {peer}", Status.FAIL, str(exc)))
        return None
    if isinstance(reply, HandshakeRejected):
        diffs = parse_rejection(reply.reason)
        report.info["rejected"] = reply.reason
        if diffs is None:
            notes: tuple[str, ...] = (reply.reason,)
        else:
            notes = diff_notes(diffs)
            report.info["diff"] = [d._asdict() for d in diffs]
        report.checks.append(
            Check(f"handshake {peer}", Status.FAIL, "peer rejected our fingerprint", notes)
        )
        return None
    if not isinstance(reply, HandshakeReply):
        report.checks.append(
            Check(f"handshake {peer}", Status.FAIL, f"answered with {type(reply).__name__}")
        )
        return None
    theirs = reply.fingerprint
    report.info["fingerprint"] = fingerprint_dict(theirs)
    report.info["layers"] = len(reply.layers)
    report.info["dp_rank"], report.info["tp_rank"] = reply.dp_rank, reply.tp_rank
    report.info["control"] = str(reply.control)
    report.info["instance_id"] = reply.instance_id
    peer_lines = (
        *describe_fingerprint(theirs),
        f"dp_rank {reply.dp_rank}, tp_rank {reply.tp_rank}, control {reply.control}",
    )
    bad = ours.incompatibilities(theirs)
    diffs = ours.diff(theirs)
    report.info["diff"] = [d._asdict() for d in ours_vs_peer(diffs)]
    if bad:
        report.checks.append(
            Check(
                f"handshake {peer}",
                Status.FAIL,
                "incompatible fingerprint",
                (*peer_lines, *diff_notes(ours_vs_peer(bad))),
            )
        )
        return None
    if diffs:
        report.checks.append(
            Check(
                f"handshake {peer}",
                Status.WARN,
                "compatible, with differences",
                (*peer_lines, *diff_notes(ours_vs_peer(diffs))),
            )
        )
    else:
        report.checks.append(
            Check(f"handshake {peer}", Status.PASS, "fingerprints match", peer_lines)
        )
    return reply


def probe_port(peer: PeerAddress, timeout: float) -> Check | None:
    """A FAIL line when nothing accepts a TCP connection at ``peer`` (refused, no route, no
    such host), so that no handshake waits out its timeout; None when it accepts or does
    not answer in time (a firewall may drop packets: the handshake then says so)."""
    try:
        with socket.create_connection((peer.host, peer.port), timeout=min(timeout, 2.0)):
            return None
    except ConnectionRefusedError:
        why = "connection refused: nothing listens there (is the engine up, and is this its "
        why += "handshake_port plus the rank's offset?)"
    except TimeoutError:
        return None
    except OSError as exc:
        why = f"cannot connect: {exc.strerror or exc}"
    return Check(f"handshake {peer}", Status.FAIL, why)


def check_peer(
    peer: PeerAddress,
    fingerprint: Fingerprint,
    *,
    transport: str,
    bind_host: str,
    timeout: float,
    secret: bytes | None,
    max_read_bytes: int,
) -> PeerReport:
    """Handshake with ``peer`` and, when compatible, READ one block; never raises for the
    peer's faults (they become FAIL lines)."""
    from moriio.adapters.zmq import ZmqControlChannel
    from moriio.container import MAX_CONTROL_FRAME_BYTES
    from moriio.domain.protocol.codec import WIRE_CODEC

    report = PeerReport(str(peer))
    unreachable = probe_port(peer, timeout)
    if unreachable is not None:
        report.checks.append(unreachable)
        return report
    try:
        engine = make_engine(transport, peer, bind_host)
    except (ImportError, TransferEngineError, RuntimeError) as exc:
        report.checks.append(Check("peer engine", Status.FAIL, f"cannot start {transport}: {exc}"))
        return report
    try:
        _talk_to_peer(
            engine,
            peer,
            fingerprint,
            ZmqControlChannel(
                WIRE_CODEC,
                bind_host,
                0,
                trusted_hosts=[peer.host],
                secret=secret,
                max_frame_bytes=MAX_CONTROL_FRAME_BYTES,
            ),
            timeout=timeout,
            max_read_bytes=max_read_bytes,
            report=report,
        )
    except (ControlChannelError, TransferEngineError, ValueError) as exc:
        report.checks.append(Check(f"peer {peer}", Status.FAIL, f"check aborted: {exc}"))
    finally:
        engine.close()
    return report


def _talk_to_peer(
    engine: TransferEngine,
    peer: PeerAddress,
    fingerprint: Fingerprint,
    channel: ControlChannel[Message],
    *,
    timeout: float,
    max_read_bytes: int,
    report: PeerReport,
) -> None:
    """Handshake on ``channel`` (closed here), then the round trip when compatible."""
    try:
        kv, _scratch = scratch_kv(engine, fingerprint.block_size)
        try:
            request = HandshakeRequest(
                fingerprint=fingerprint,
                engine_metadata=engine.metadata(),
                layers=kv.layer_regions(),
                control=channel.address,
                dp_rank=0,
                tp_rank=0,
                instance_id=engine.name,
            )
            reply = _handshake(channel, request, peer, timeout, report)
            if reply is not None:
                report.checks.append(_round_trip(engine, reply, timeout, max_read_bytes, report))
        finally:
            kv.deregister(engine)
    finally:
        channel.close()


def _round_trip(
    engine: TransferEngine,
    reply: HandshakeReply,
    timeout: float,
    max_read_bytes: int,
    report: PeerReport,
) -> Check:
    if not reply.layers:
        return Check("round trip", Status.WARN, "skipped: the peer exposes no KV layer")
    layer = reply.layers[0]
    if layer.block_len > max_read_bytes:
        return Check(
            "round trip",
            Status.WARN,
            f"skipped: block of layer {layer.name!r} is {layer.block_len} B, "
            f"over --max-read-bytes {max_read_bytes}",
        )
    info: dict[str, Any] = {"layer": layer.name, "bytes": layer.block_len}
    report.info["round_trip"] = info
    try:
        return _read_block(engine, layer, reply, timeout, info)
    except (TransferEngineError, ValueError) as exc:
        return Check("round trip", Status.FAIL, f"cannot READ from layer {layer.name!r}: {exc}")
