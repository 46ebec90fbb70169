"""This worker's registered KV cache: one region and one geometry per layer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from moriio.domain.kv.head_slices import GroupSlicing, SliceLayout
from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.protocol.handshake import LayerRegions
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
    slicing: tuple[GroupSlicing, ...] = ()


class LocalKV:
    """Layers in registration order (the order both peers agree on)."""

    def __init__(self, layers: Sequence[RegisteredLayer], dtype: str) -> None:
        """``dtype``: the layers' dtype names, comma-joined when they differ (an MLA indexer
        beside its attention layers)."""
        if not layers:
            raise ValueError("a KV cache needs at least one layer")
        self._layers = {layer.name: layer for layer in layers}
        if len(self._layers) != len(layers):
            raise ValueError("duplicate layer names in the KV cache")
        self.dtype = dtype

    @classmethod
    def register(cls, engine: TransferEngine, tensors: Sequence[LayerTensor]) -> LocalKV:
        """Describe every layer's layout and register its whole extent with ``engine``, naming
        the storage it lies in (an engine may register each storage once)."""
        layers = []
        try:
            for t in tensors:
                geometry = t.geometry
                storage = t.storage
                if storage is not None and not storage.contains(t.addr, geometry.region_len):
                    storage = None  # the layer reaches past it: register the layer alone
                region = engine.register_region(
                    t.addr, geometry.region_len, t.kind, t.device_id, storage
                )
                layers.append(RegisteredLayer(t.name, geometry, region, t.slicing))
        except Exception:
            for layer in layers:
                engine.deregister_region(layer.region)
            raise
        return cls(layers, ",".join(sorted({t.dtype for t in tensors})))

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
                slices=tuple(
                    s.to_wire() if isinstance(s, SliceLayout) else () for s in layer.slicing
                ),
            )
            for layer in self._layers.values()
        )

    def deregister(self, engine: TransferEngine) -> None:
        for layer in self._layers.values():
            engine.deregister_region(layer.region)
