"""Fingerprints as ``moriio doctor`` shows them, and the differences a peer reports."""

from __future__ import annotations

import re
from typing import Any

from moriio.domain.wire.handshake import FieldDiff, Fingerprint

FLAG_FOR_FIELD = {
    "model_name": "--model",
    "dtype": "--dtype",
    "block_size": "--block-size",
    "num_layers": "--num-layers",
    "layout_kinds": "--layout-kind",
    "tp_size": "--tp-size",
    "transfer_mode": "--mode",
    "total_num_kv_heads": "--num-kv-heads",
    "is_mla": "--mla",
}
_DIFF = re.compile(r"^(\w+) differs \(ours=(.*), theirs=(.*?)\)(?:: (.*))?$", re.DOTALL)
_NEXT_DIFF = re.compile(r"; (?=\w+ differs \(ours=)")


def fingerprint_dict(fp: Fingerprint) -> dict[str, Any]:
    return {
        "model_name": fp.model_name,
        "dtype": fp.dtype,
        "block_size": fp.block_size,
        "num_layers": fp.num_layers,
        "layout_kinds": sorted(set(fp.layout_kinds)),
        "tp_size": fp.tp_size,
        "transfer_mode": fp.transfer_mode.value,
        "total_num_kv_heads": fp.total_num_kv_heads,
        "is_mla": fp.is_mla,
    }


def describe_fingerprint(fp: Fingerprint) -> tuple[str, ...]:
    kinds = ", ".join(f"{k} x{fp.layout_kinds.count(k)}" for k in sorted(set(fp.layout_kinds)))
    return (
        f"model {fp.model_name!r}, dtype {fp.dtype}, block_size {fp.block_size}",
        f"{fp.num_layers} layers ({kinds}), tp_size {fp.tp_size}, "
        f"mode {fp.transfer_mode.value}, {fp.total_num_kv_heads} KV heads"
        + (", MLA" if fp.is_mla else ""),
    )


def ours_vs_peer(diffs: list[FieldDiff]) -> list[FieldDiff]:
    """Fingerprint.diff values (ours vs theirs) as printable reprs."""
    return [FieldDiff(d.field, repr(d.ours), repr(d.theirs), d.note) for d in diffs]


def parse_rejection(reason: str) -> list[FieldDiff] | None:
    """The field diffs in a peer's rejection, from our side (None if it lists none).

    The peer words the differences from its side (``ours`` = the peer's value), so the
    values are swapped; they stay the reprs the peer wrote.
    """
    body = reason.removeprefix("incompatible peer: ")
    if body == reason:
        return None
    diffs = []
    for part in _NEXT_DIFF.split(body):
        match = _DIFF.match(part)
        if match is None:
            return None
        name, peer_value, our_value, note = match.groups()
        diffs.append(FieldDiff(name, our_value, peer_value, note or ""))
    return diffs


def diff_notes(diffs: list[FieldDiff]) -> tuple[str, ...]:
    notes = []
    for d in diffs:
        text = f"{d.field}: ours={d.ours} peer={d.theirs}"
        if d.note:
            text += f" ({d.note})"
        flag = FLAG_FOR_FIELD.get(d.field)
        if flag:
            text += f"  [{flag}]"
        notes.append(text)
    return tuple(notes)
