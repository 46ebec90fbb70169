import dataclasses

import pytest

from moriio.domain.protocol.fingerprint import Fingerprint, IncompatiblePeerError
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.values.modes import TransferMode


def _fp(**changes: object) -> Fingerprint:
    base = Fingerprint(
        model_name="meta-llama/Llama-3.1-8B",
        dtype="bfloat16",
        block_size=16,
        layout_kinds=("separated",) * 4,
        tp_size=4,
        transfer_mode=TransferMode.WRITE,
        total_num_kv_heads=8,
        is_mla=False,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_identical_fingerprints_have_no_diff() -> None:
    assert _fp().diff(_fp()) == []
    _fp().check_compatible(_fp())


def test_diff_lists_each_differing_field_with_both_values() -> None:
    diffs = _fp().diff(_fp(dtype="float16", block_size=32, transfer_mode=TransferMode.READ))
    assert [(d.field, d.ours, d.theirs) for d in diffs] == [
        ("dtype", "bfloat16", "float16"),
        ("block_size", 16, 32),
        ("transfer_mode", "write", "read"),
    ]


def test_mismatch_error_names_the_field_and_values() -> None:
    with pytest.raises(IncompatiblePeerError, match=r"dtype differs.*'bfloat16'.*'float16'") as e:
        _fp().check_compatible(_fp(dtype="float16"))
    assert [d.field for d in e.value.diffs] == ["dtype"]


def test_layer_count_and_kind_differences_are_reported() -> None:
    (count,) = _fp().diff(_fp(layout_kinds=("separated",) * 5))
    assert (count.field, count.ours, count.theirs) == ("num_layers", 4, 5)
    (kind,) = _fp().diff(_fp(layout_kinds=("separated", "separated", "mla", "separated")))
    assert (kind.field, kind.ours, kind.theirs, kind.note) == (
        "layout_kinds",
        "separated",
        "mla",
        "layer 2",
    )


def test_supported_heterogeneous_tp_is_compatible() -> None:
    ours = _fp(tp_size=8, total_num_kv_heads=4)
    theirs = _fp(tp_size=4, total_num_kv_heads=4)
    assert [d.field for d in ours.diff(theirs)] == ["tp_size"]
    ours.check_compatible(theirs)


def test_tp_that_splits_kv_heads_is_left_to_the_layers_shards() -> None:
    """The fingerprint accepts any pair of TP sizes that are multiples of each other: whether
    split heads line up is checked per layer on the peer's regions (tp_layers)."""
    _fp(tp_size=2).check_compatible(_fp(tp_size=4))


def test_non_multiple_tp_is_incompatible() -> None:
    with pytest.raises(IncompatiblePeerError, match=r"tp_size differs.*multiple"):
        _fp(tp_size=6, is_mla=True).check_compatible(_fp(tp_size=4, is_mla=True))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_name", ""),
        ("dtype", 3),
        ("block_size", 0),
        ("block_size", True),
        ("layout_kinds", ()),
        ("layout_kinds", ["separated"]),
        ("tp_size", -1),
        ("transfer_mode", "read"),
        ("total_num_kv_heads", 0),
        ("is_mla", 1),
    ],
)
def test_fingerprint_validates_its_fields(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.rstrip("s") if field == "layout_kinds" else field):
        _fp(**{field: value})


def test_layer_regions_validate() -> None:
    LayerRegions(name="l0", descriptors=(b"k", b"v"), num_blocks=8, block_len=4096)
    with pytest.raises(ValueError, match="descriptor"):
        LayerRegions(name="l0", descriptors=(), num_blocks=8, block_len=4096)
    with pytest.raises(ValueError, match="num_blocks"):
        LayerRegions(name="l0", descriptors=(b"k",), num_blocks=0, block_len=4096)
    with pytest.raises(ValueError, match="tuple of bytes"):
        LayerRegions(name="l0", descriptors=("k",), num_blocks=1, block_len=1)  # type: ignore[arg-type]
