"""The fingerprint peers compare in a handshake, and the compatibility check on it.

A :class:`Fingerprint` summarises everything two peers must agree on before one touches the
other's KV cache: the engine and backend that give the bytes their meaning (vLLM version,
resolved page order, cache dtype string, attention backend, platform, cache groups,
speculative config) and, per layer in order, :class:`LayerFacts`.
:meth:`Fingerprint.check_compatible` refuses a peer with an error naming every field that
differs. TP sizes may differ when they are multiples of each other (see
:mod:`moriio.domain.protocol.tp_compat`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from moriio.domain.protocol.tp_compat import (
    TP_SCALED_LAYER_FIELDS,
    same_groups_across_tp,
    tp_pair_problem,
)
from moriio.domain.values.modes import TransferMode


class FieldDiff(NamedTuple):
    """One fingerprint field that differs between two peers."""

    field: str
    ours: object
    theirs: object
    note: str = ""

    def describe(self) -> str:
        text = f"{self.field} differs (ours={self.ours!r}, theirs={self.theirs!r})"
        return f"{text}: {self.note}" if self.note else text


class IncompatiblePeerError(ValueError):
    """A handshake found a peer whose fingerprint is incompatible with ours."""

    def __init__(self, diffs: list[FieldDiff]) -> None:
        super().__init__("incompatible peer: " + "; ".join(d.describe() for d in diffs))
        self.diffs = diffs


def require_text(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a non-empty str."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")


def require_positive(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


STATE_GROUP_MARK = ":state="  # in a ``groups`` entry: the group holds recurrent state


@dataclass(frozen=True, slots=True)
class LayerFacts:
    """What gives one layer's KV bytes their meaning, as its engine declares it.

    ``spec``: the engine's spec class (``FullAttentionSpec``, ``MLAAttentionSpec``, ...);
    ``role``: a cache role beside attention (e.g. an MLA indexer), else empty; ``quant``: the
    quantisation mode; ``heads``: head slots of a page; ``content_bytes``: bytes of one
    (slot, state) cell; ``page_bytes``: a block's page as allocated (padding included).
    """

    name: str
    spec: str
    role: str
    dtype: str
    quant: str
    block_size: int
    kernel_block_size: int
    heads: int
    content_bytes: int
    page_bytes: int

    def __post_init__(self) -> None:
        for name in ("name", "spec", "dtype"):
            require_text(f"layer {name}", getattr(self, name))
        for name in ("role", "quant"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"layer {name} must be a str, got {getattr(self, name)!r}")
        for name in LAYER_NUMBERS:
            require_positive(f"layer {name}", getattr(self, name))

    def diff(self, other: LayerFacts, index: int) -> list[FieldDiff]:
        return [
            FieldDiff(f"layers[{index}].{name}", ours, theirs, f"layer {self.name!r}")
            for name in LAYER_FIELDS
            if (ours := getattr(self, name)) != (theirs := getattr(other, name))
        ]


LAYER_TEXTS = ("name", "spec", "role", "dtype", "quant")
LAYER_NUMBERS = ("block_size", "kernel_block_size", "heads", "content_bytes", "page_bytes")
LAYER_FIELDS = LAYER_TEXTS + LAYER_NUMBERS
ENGINE_TEXTS = (
    "vllm_version",
    "kv_layout",
    "cache_dtype",
    "attn_backend",
    "platform",
    "speculative",
    "value_layout",
)
"""Engine-wide text fields of a :class:`Fingerprint` (empty where the engine has none)."""
OPTIONAL_ENGINE_TEXTS = ("value_layout",)
"""Engine-wide text fields a handshake may leave out (read as empty)."""
_ALWAYS = ("model_name", "dtype", "block_size")  # compared even without an engine


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What two peers must agree on. ``layout_kinds`` has one entry per layer, in order.

    ``value_layout``: how V sits in a page beyond what its shape, strides and backend say
    (ROCm's ``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` setting and interleaved V writes).

    The engine-wide fields after ``is_mla`` and ``layers`` (one :class:`LayerFacts` per
    layer, in order) default to empty for cores used without an engine that declares them
    (``moriio doctor``, another connector on the core). Between two engines (both declare
    ``vllm_version``) every field is compared; otherwise a field only when both declare it.
    The vLLM connector always declares every one.
    """

    model_name: str
    dtype: str
    block_size: int
    layout_kinds: tuple[str, ...]
    tp_size: int
    transfer_mode: TransferMode
    total_num_kv_heads: int
    is_mla: bool
    vllm_version: str = ""
    kv_layout: str = ""
    cache_dtype: str = ""
    attn_backend: str = ""
    platform: str = ""
    speculative: str = ""
    value_layout: str = ""
    groups: tuple[str, ...] = ()
    pp_size: int = 1
    dcp_size: int = 1
    layers: tuple[LayerFacts, ...] = ()

    def __post_init__(self) -> None:
        require_text("model_name", self.model_name)
        require_text("dtype", self.dtype)
        require_positive("block_size", self.block_size)
        if not isinstance(self.layout_kinds, tuple) or not self.layout_kinds:
            raise ValueError(f"layout_kinds must be a non-empty tuple, got {self.layout_kinds!r}")
        for kind in self.layout_kinds:
            require_text("layout_kinds entry", kind)
        require_positive("tp_size", self.tp_size)
        if not isinstance(self.transfer_mode, TransferMode):
            raise ValueError(f"transfer_mode must be a TransferMode, got {self.transfer_mode!r}")
        require_positive("total_num_kv_heads", self.total_num_kv_heads)
        if not isinstance(self.is_mla, bool):
            raise ValueError(f"is_mla must be a bool, got {self.is_mla!r}")
        for name in ENGINE_TEXTS:
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str, got {getattr(self, name)!r}")
        if not isinstance(self.groups, tuple) or not all(isinstance(g, str) for g in self.groups):
            raise ValueError(f"groups must be a tuple of str, got {self.groups!r}")
        require_positive("pp_size", self.pp_size)
        require_positive("dcp_size", self.dcp_size)
        if not isinstance(self.layers, tuple) or not all(
            isinstance(layer, LayerFacts) for layer in self.layers
        ):
            raise ValueError("layers must be a tuple of LayerFacts")
        if self.layers and len(self.layers) != len(self.layout_kinds):
            raise ValueError(
                f"{len(self.layers)} layer facts for {len(self.layout_kinds)} layout kinds"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layout_kinds)

    def diff(self, other: Fingerprint) -> list[FieldDiff]:
        """Every field whose value differs, as (field, ours, theirs[, note])."""
        engines = bool(self.vllm_version and other.vllm_version)
        diffs = [
            FieldDiff(name, getattr(self, name), getattr(other, name))
            for name in ("model_name", "dtype", "block_size", *ENGINE_TEXTS, "groups")
            if getattr(self, name) != getattr(other, name)
            and (engines or name in _ALWAYS or (getattr(self, name) and getattr(other, name)))
        ]
        if self.num_layers != other.num_layers:
            diffs.append(FieldDiff("num_layers", self.num_layers, other.num_layers))
        else:
            if self.layout_kinds != other.layout_kinds:
                pairs = zip(self.layout_kinds, other.layout_kinds, strict=True)
                i = next(i for i, (a, b) in enumerate(pairs) if a != b)
                diffs.append(
                    FieldDiff(
                        "layout_kinds", self.layout_kinds[i], other.layout_kinds[i], f"layer {i}"
                    )
                )
            diffs += self._layer_diffs(other)
        for name in ("tp_size", "pp_size", "dcp_size"):
            if getattr(self, name) != getattr(other, name):
                diffs.append(FieldDiff(name, getattr(self, name), getattr(other, name)))
        if self.transfer_mode is not other.transfer_mode:
            diffs.append(
                FieldDiff("transfer_mode", self.transfer_mode.value, other.transfer_mode.value)
            )
        for name in ("total_num_kv_heads", "is_mla"):
            if getattr(self, name) != getattr(other, name):
                diffs.append(FieldDiff(name, getattr(self, name), getattr(other, name)))
        return diffs

    def _layer_diffs(self, other: Fingerprint) -> list[FieldDiff]:
        """The first layer whose facts differ, every differing field of it (none when a side
        does not describe its layers)."""
        if not self.layers or not other.layers:
            return []
        for i, (ours, theirs) in enumerate(zip(self.layers, other.layers, strict=True)):
            found = ours.diff(theirs, i)
            if found:
                return found
        return []

    def incompatibilities(self, other: Fingerprint) -> list[FieldDiff]:
        """The differences that forbid transfers. TP sizes may differ when one is a multiple
        of the other: then what a rank's shard scales (head slots, cell and page bytes, a
        state's shapes) may differ too, and the layers' shards are checked where the peer's
        regions arrive (:func:`moriio.domain.protocol.tp_compat.check_sliced_layers`)."""
        result = []
        split = self.tp_size != other.tp_size
        for d in self.diff(other):
            if d.field == "tp_size":
                problem = tp_pair_problem(self.tp_size, other.tp_size)
                if problem is not None:
                    result.append(d._replace(note=problem))
                continue
            if (
                split
                and d.field.startswith("layers[")
                and (d.field.rsplit(".", 1)[-1] in TP_SCALED_LAYER_FIELDS)
            ):
                continue
            if split and d.field == "groups" and same_groups_across_tp(self.groups, other.groups):
                continue
            result.append(d)
        return result

    def has_state_groups(self) -> bool:
        """Whether a KV-cache group holds recurrent state (see ``groups``)."""
        return any(STATE_GROUP_MARK in group for group in self.groups)

    def check_compatible(self, other: Fingerprint) -> None:
        """Raise :class:`IncompatiblePeerError` naming each field that forbids transfers."""
        diffs = self.incompatibilities(other)
        if diffs:
            raise IncompatiblePeerError(diffs)
