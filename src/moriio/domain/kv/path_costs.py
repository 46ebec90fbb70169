"""Which path a request's KV takes between two peers, chosen by what each path costs here.

A transport pays per post (host time to check, plan and hand the batch over), per
descriptor (a UCX operation, an RDMA work request) and per byte on the wire; a staging
region trades descriptors for two local copies (the sender gathers the request's pieces into
its staging region, one or a few large descriptors cross, the receiver scatters them). The
estimate of a path adds these up, without assuming any overlap:

    seconds = posts * per_post + descriptors * per_descriptor + bytes / link_bandwidth
              + copied_bytes / copy_bandwidth + copy_segments * per_segment

The figures differ per host, per memory kind and per peer (same host, or across hosts):
:data:`DEFAULT_FIGURES` are the documented defaults (docs/deploying.md says where each comes
from); ``moriio bench --paths`` measures this host's, which ``moriio plan --figures``
reads.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from moriio.ports import MemoryKind


class TransferPath(enum.Enum):
    PER_BLOCK = "per_block"  # the reference: a descriptor per block per layer, a post per layer
    PER_LAYER = "per_layer"  # a post per layer, contiguous runs merged within the layer
    REQUEST = "request"  # a post per request per peer, every layer merged by remote offset
    STAGED = "staged"  # gather into a staging region, a descriptor per fill, scatter
    STAGED_LAYERWISE = "staged_layerwise"  # the same, one layer per fill (layer-wise loads)
    SAME_HOST_COPY = "same_host_copy"  # device memory mapped from a same-host peer: one launch


@dataclass(frozen=True, slots=True)
class PathFigures:
    """What moving bytes costs for one memory kind and peer locality (seconds; bytes/s)."""

    per_post: float
    per_descriptor: float
    link_bandwidth: float
    copy_bandwidth: float
    per_segment: float = 0.0  # a gather or scatter piece on top of its bytes
    source: str = "default"

    def __post_init__(self) -> None:
        for name in ("per_post", "per_descriptor", "per_segment"):
            value = getattr(self, name)
            if not (_number(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("link_bandwidth", "copy_bandwidth"):
            value = getattr(self, name)
            if not (_number(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


FigureKey = tuple[MemoryKind, bool]  # memory kind, peer on the same host

DEFAULT_FIGURES: dict[FigureKey, PathFigures] = {
    # NIXL over UCX's CMA on this project's 2-core machine (moriio bench --paths): 13 us per
    # post, 2.0 us per descriptor, 11.5 GB/s on the wire, memcpy at 14.5 GB/s, 0.85 us per
    # host gather segment.
    (MemoryKind.HOST, True): PathFigures(13e-6, 2.0e-6, 11.5e9, 14.5e9, 0.85e-6),
    # UCX over TCP or RDMA between hosts: a 100 Gb/s link, the same host costs.
    (MemoryKind.HOST, False): PathFigures(13e-6, 2.0e-6, 12.5e9, 14.5e9, 0.85e-6),
    # NIXL over cuda_ipc on an H200 (docs/deploying.md): ~6.5 us per descriptor, contiguous
    # copies at 670-830 GB/s, the device's gather at ~300 GB/s, 80 us of host time per post.
    (MemoryKind.DEVICE, True): PathFigures(80e-6, 6.5e-6, 700e9, 300e9),
    # RDMA between hosts (400 Gb/s): 16 KiB descriptors reach ~9 GB/s per rank in peers'
    # reports, ~1.8 us per descriptor.
    (MemoryKind.DEVICE, False): PathFigures(80e-6, 1.8e-6, 50e9, 300e9),
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """A request as the cost model sees it.

    ``runs``: descriptors of one layer once contiguous runs are merged (``blocks`` times
    ``chunks_per_block`` when no two blocks are neighbours); ``row_runs``: descriptors of
    the whole request merged across layers (block-outermost page orders put every layer's
    page of a block in one row); ``staging_bytes``: the staging region per peer (0: none).
    """

    layers: int
    blocks: int
    chunk_bytes: int
    memory: MemoryKind
    same_host: bool
    chunks_per_block: int = 1
    runs: int | None = None
    row_runs: int | None = None
    staging_bytes: int = 0
    layerwise: bool = False
    same_host_copies: bool = True

    def __post_init__(self) -> None:
        for name in ("layers", "blocks", "chunk_bytes", "chunks_per_block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.staging_bytes < 0:
            raise ValueError(f"staging_bytes must be >= 0, got {self.staging_bytes}")

    @property
    def pieces_per_layer(self) -> int:
        return self.blocks * self.chunks_per_block

    @property
    def layer_bytes(self) -> int:
        return self.pieces_per_layer * self.chunk_bytes

    @property
    def total_bytes(self) -> int:
        return self.layers * self.layer_bytes


@dataclass(frozen=True, slots=True)
class PathEstimate:
    path: TransferPath
    descriptors: int
    posts: int
    copied_bytes: int  # local gather and scatter bytes on top of the wire's
    seconds: float
    available: bool = True
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PathChoice:
    chosen: PathEstimate
    estimates: tuple[PathEstimate, ...]
    figures: PathFigures


def _estimate(
    path: TransferPath,
    scenario: Scenario,
    figures: PathFigures,
    descriptors: int,
    posts: int,
    segments: int = 0,
) -> PathEstimate:
    """``segments``: pieces gathered on one side (and scattered on the other) when staged."""
    staged = path in (TransferPath.STAGED, TransferPath.STAGED_LAYERWISE)
    copied = 2 * scenario.total_bytes if staged else 0
    segments *= 2
    wire = scenario.total_bytes / figures.link_bandwidth
    if path is TransferPath.SAME_HOST_COPY:  # one launch: the device's gather, no wire
        copied, wire = scenario.total_bytes, 0.0
    seconds = (
        posts * figures.per_post
        + descriptors * figures.per_descriptor
        + wire
        + copied / figures.copy_bandwidth
        + segments * figures.per_segment
    )
    return PathEstimate(path, descriptors, posts, copied, seconds)


def estimate_paths(scenario: Scenario, figures: PathFigures) -> tuple[PathEstimate, ...]:
    """Every path's descriptors, posts and estimated seconds; those this request cannot
    take are marked unavailable with the reason."""
    s = scenario
    runs = s.runs or s.pieces_per_layer
    row_runs = s.row_runs or s.layers * runs
    staging = s.staging_bytes
    fills = math.ceil(s.total_bytes / staging) if staging else 0
    layer_fills = s.layers * math.ceil(s.layer_bytes / staging) if staging else 0
    per_block = s.layers * s.pieces_per_layer
    out = [
        _estimate(TransferPath.PER_BLOCK, s, figures, per_block, s.layers),
        _estimate(TransferPath.PER_LAYER, s, figures, s.layers * runs, s.layers),
        _estimate(TransferPath.REQUEST, s, figures, row_runs, 1),
        _estimate(TransferPath.STAGED, s, figures, fills, fills, row_runs),
        _estimate(
            TransferPath.STAGED_LAYERWISE, s, figures, layer_fills, layer_fills, s.layers * runs
        ),
        _estimate(TransferPath.SAME_HOST_COPY, s, figures, 0, 1),
    ]
    why_not = {
        TransferPath.PER_BLOCK: "the reference: runs of blocks are always merged",
        TransferPath.REQUEST: "layer-wise loads post layer by layer" if s.layerwise else "",
        TransferPath.STAGED: (
            "no staging region"
            if not staging
            else "layer-wise loads stage layer by layer"
            if s.layerwise
            else ""
        ),
        TransferPath.STAGED_LAYERWISE: "no staging region" if not staging else "",
        TransferPath.SAME_HOST_COPY: (
            "host memory moves through the transport"
            if s.memory is MemoryKind.HOST
            else "the peer is on another host"
            if not s.same_host
            else "same-host device copies are off"
            if not s.same_host_copies
            else ""
        ),
    }
    return tuple(
        replace(e, available=False, reason=why_not[e.path]) if why_not.get(e.path) else e
        for e in out
    )


def choose_path(scenario: Scenario, figures: PathFigures | None = None) -> PathChoice:
    """The cheapest available path (ties go to the one listed first: fewer moving parts)."""
    figs = figures or DEFAULT_FIGURES[(scenario.memory, scenario.same_host)]
    estimates = estimate_paths(scenario, figs)
    chosen = min((e for e in estimates if e.available), key=lambda e: e.seconds)
    return PathChoice(chosen, estimates, figs)


DEFAULT_STAGING_BYTES = 128 << 20
"""The staging region per peer that ``moriio plan`` assumes unless told otherwise."""

FIGURE_FIELDS = ("per_post", "per_descriptor", "link_bandwidth", "copy_bandwidth", "per_segment")


def figure_name(key: FigureKey) -> str:
    """``"host/local"``, ``"device/remote"``...: how a figures file names a key."""
    memory, same_host = key
    return f"{memory.value}/{'local' if same_host else 'remote'}"


def parse_figures(raw: object, source: str) -> dict[FigureKey, PathFigures]:
    """The defaults, overridden by ``raw``: ``{"device/remote": {"per_descriptor": 2e-6,
    ...}, ...}`` (what ``moriio bench --paths`` writes). ValueError names what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: figures must be a JSON object, got {type(raw).__name__}")
    by_name = {figure_name(key): key for key in DEFAULT_FIGURES}
    figures = dict(DEFAULT_FIGURES)
    for name, fields in raw.items():
        key = by_name.get(name)
        if key is None:
            known = ", ".join(sorted(by_name))
            raise ValueError(f"{source}: unknown figures {name!r} (known: {known})")
        if not isinstance(fields, dict) or not set(fields) <= set(FIGURE_FIELDS):
            raise ValueError(
                f"{source}: {name} must be an object of {', '.join(FIGURE_FIELDS)}, got {fields!r}"
            )
        try:
            figures[key] = replace(figures[key], **fields, source=source)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {name}: {exc}") from None
    return figures
