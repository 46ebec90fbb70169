"""This worker's registered KV cache: one region and one geometry per layer, and the spans.

A *span* is a whole allocation that several layers' regions lie in (vLLM's one KV buffer),
registered once more as a region of its own: a request's every layer can then move in one
batch against it (:mod:`moriio.domain.kv.request_plan`), each layer at its placement.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from moriio.domain.kv.head_slices import GroupSlicing, SliceLayout
from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.kv.request_plan import Placement
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import MAX_SPANS
from moriio.ports import Allocation, LocalRegion, MemoryKind, TransferEngine


@dataclass(frozen=True, slots=True)
class LayerTensor:
    """A KV-cache tensor as plain numbers (the vLLM facade converts torch tensors).

    ``storage``: the whole allocation the tensor views (vLLM's one shared KV buffer), when
    known; layers in one storage may then be registered as one region. ``slicing``: how each
    KV-cache group's pages of the tensor shard over TP ranks, in group order (empty: not
    known; pages then move only whole, between ranks that hold the same heads).
    """

    name: str
    addr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int
    dtype: str
    spec: LayerSpec
    kind: MemoryKind = MemoryKind.HOST
    device_id: int = 0
    storage: Allocation | None = None
    slicing: tuple[GroupSlicing, ...] = ()
    geometry: LayerGeometry = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Describe the layout once; ValueError when the planner cannot move it."""
        geometry = describe_layout(self.shape, self.strides, self.itemsize, self.spec)
        object.__setattr__(self, "geometry", geometry)


@dataclass(frozen=True, slots=True)
class RegisteredLayer:
    name: str
    geometry: LayerGeometry
    region: LocalRegion
    placement: Placement | None = None  # where the region lies in a span (None: in none)
    slicing: tuple[GroupSlicing, ...] = ()


SpanKey = tuple[Allocation, MemoryKind, int]  # the allocation, its memory kind and device


class LocalKV:
    """Layers in registration order (the order both peers agree on), and the spans."""

    def __init__(
        self, layers: Sequence[RegisteredLayer], dtype: str, spans: Sequence[LocalRegion] = ()
    ) -> None:
        """``dtype``: the layers' dtype names, comma-joined when they differ (an MLA indexer
        beside its attention layers); ``spans``: the regions layers' placements name."""
        if not layers:
            raise ValueError("a KV cache needs at least one layer")
        self._layers = {layer.name: layer for layer in layers}
        if len(self._layers) != len(layers):
            raise ValueError("duplicate layer names in the KV cache")
        for layer in layers:
            if layer.placement is not None and layer.placement.span >= len(spans):
                raise ValueError(f"layer {layer.name!r} lies in an unknown span")
        self.dtype = dtype
        self.registered = True
        self.spans = tuple(spans)

    @classmethod
    def register(cls, engine: TransferEngine, tensors: Sequence[LayerTensor]) -> LocalKV:
        """Describe every layer's layout and register its whole extent with ``engine``, naming
        the storage it lies in (an engine may register each storage once); then register as a
        span each storage that holds two layers or more (the first ``MAX_SPANS``)."""
        layers: list[RegisteredLayer] = []
        spans: list[LocalRegion] = []
        try:
            keys: list[SpanKey | None] = []
            for t in tensors:
                geometry = t.geometry
                storage = t.storage
                if storage is not None and not storage.contains(t.addr, geometry.region_len):
                    storage = None  # the layer reaches past it: register the layer alone
                region = engine.register_region(
                    t.addr, geometry.region_len, t.kind, t.device_id, storage
                )
                layers.append(RegisteredLayer(t.name, geometry, region, slicing=t.slicing))
                keys.append(None if storage is None else (storage, t.kind, t.device_id))
            shared = [k for k in dict.fromkeys(keys) if k is not None and keys.count(k) > 1]
            del shared[MAX_SPANS:]  # what a handshake carries; other layers move alone
            for storage, kind, device_id in shared:
                spans.append(
                    engine.register_region(storage.addr, storage.length, kind, device_id, storage)
                )
            for i, key in enumerate(keys):
                if key in shared:
                    span = shared.index(key)
                    offset = layers[i].region.addr - spans[span].addr
                    layers[i] = replace(layers[i], placement=Placement(span, offset))
        except Exception:
            for region in (*spans, *(layer.region for layer in layers)):
                engine.deregister_region(region)
            raise
        return cls(layers, ",".join(sorted({t.dtype for t in tensors})), spans)

    def __iter__(self) -> Iterator[RegisteredLayer]:
        return iter(self._layers.values())

    def __len__(self) -> int:
        return len(self._layers)

    def __contains__(self, name: object) -> bool:
        return name in self._layers

    def get(self, name: str) -> RegisteredLayer | None:
        return self._layers.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._layers)

    @property
    def layout_kinds(self) -> tuple[str, ...]:
        return tuple(layer.geometry.kind.value for layer in self._layers.values())

    def layer_regions(self) -> tuple[LayerRegions, ...]:
        """What a peer needs to address our blocks (sent in handshakes)."""
        return tuple(
            LayerRegions(
                name=layer.name,
                descriptors=(layer.region.descriptor,),
                num_blocks=layer.geometry.num_blocks,
                block_len=layer.geometry.block_len,
                block_stride=layer.geometry.block_stride_bytes,
                span=-1 if layer.placement is None else layer.placement.span,
                span_offset=0 if layer.placement is None else layer.placement.offset,
                slices=tuple(
                    s.to_wire() if isinstance(s, SliceLayout) else () for s in layer.slicing
                ),
            )
            for layer in self._layers.values()
        )

    def span_descriptors(self) -> tuple[bytes, ...]:
        """The spans' region descriptors (sent in handshakes with :meth:`layer_regions`)."""
        return tuple(span.descriptor for span in self.spans)

    def deregister(self, engine: TransferEngine) -> None:
        """Give every layer's region back to ``engine`` (once: later calls do nothing)."""
        if not self.registered:
            return
        self.registered = False
        for layer in self._layers.values():
            engine.deregister_region(layer.region)
        for span in self.spans:
            engine.deregister_region(span)

    def same_layout(self, other: LocalKV) -> bool:
        """Whether ``other`` has our layers, in order, with our geometries (only where the
        memory lies may differ)."""
        ours = [(x.name, x.geometry) for x in self]
        return ours == [(x.name, x.geometry) for x in other]
