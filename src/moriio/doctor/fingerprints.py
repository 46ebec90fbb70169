"""Fingerprints as ``moriio doctor`` shows them, and the differences a peer reports."""

from __future__ import annotations

import re
from typing import Any

from moriio.domain.protocol.fingerprint import ENGINE_TEXTS, FieldDiff, Fingerprint, LayerFacts

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
        **{name: getattr(fp, name) for name in ENGINE_TEXTS},
        "groups": list(fp.groups),
        "pp_size": fp.pp_size,
        "dcp_size": fp.dcp_size,
        "layers": [_layer_dict(layer) for layer in fp.layers],
    }


def _layer_dict(layer: LayerFacts) -> dict[str, Any]:
    return {name: getattr(layer, name) for name in LayerFacts.__slots__}


def describe_layers(layers: tuple[LayerFacts, ...]) -> tuple[str, ...]:
    """One line per run of layers with the same facts (names aside)."""
    lines: list[str] = []
    runs: list[tuple[tuple[object, ...], list[str]]] = []
    for layer in layers:
        facts = tuple(getattr(layer, n) for n in LayerFacts.__slots__ if n != "name")
        if runs and runs[-1][0] == facts:
            runs[-1][1].append(layer.name)
        else:
            runs.append((facts, [layer.name]))
    for facts, names in runs:
        spec, role, dtype, quant, bs, kbs, heads, content, page = facts
        where = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        lines.append(
            f"layer {where}: {spec}{f' ({role})' if role else ''} {dtype} {quant}, "
            f"block {bs} (kernel {kbs}), {heads} head slots x {content} B, page {page} B"
        )
    return tuple(lines)


def describe_fingerprint(fp: Fingerprint) -> tuple[str, ...]:
    kinds = ", ".join(f"{k} x{fp.layout_kinds.count(k)}" for k in sorted(set(fp.layout_kinds)))
    return (
        f"model {fp.model_name!r}, dtype {fp.dtype}, block_size {fp.block_size}",
        f"{fp.num_layers} layers ({kinds}), tp_size {fp.tp_size}, "
        f"mode {fp.transfer_mode.value}, {fp.total_num_kv_heads} KV heads"
        + (", MLA" if fp.is_mla else ""),
        *(
            (
                f"vLLM {fp.vllm_version} on {fp.platform}, page order {fp.kv_layout}, "
                f"cache dtype {fp.cache_dtype}, backend {fp.attn_backend}, "
                f"groups {', '.join(fp.groups)}, pp {fp.pp_size}, dcp {fp.dcp_size}"
                + (f", speculative {fp.speculative}" if fp.speculative else ""),
            )
            if fp.vllm_version
            else ()
        ),
        *describe_layers(fp.layers),
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
