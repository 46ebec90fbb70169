"""Output helpers of the ``moriio`` command."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from moriio.output import fmt_bytes, fmt_num, format_table, stdout_to_stderr, to_json


def test_to_json_converts_numpy_values_and_nulls_non_finite_floats() -> None:
    value = {"a": np.int64(3), "b": np.arange(3), "c": float("nan"), "d": (1.5, np.float32(2))}

    assert json.loads(to_json(value)) == {"a": 3, "b": [0, 1, 2], "c": None, "d": [1.5, 2.0]}


def test_format_table_aligns_columns() -> None:
    text = format_table(["name", "n"], [["a", 1], ["bbb", 100]], right=(1,))

    assert text.splitlines() == ["name    n", "----  ---", "a       1", "bbb   100"]


@pytest.mark.parametrize(
    ("n", "text"), [(512, "512 B"), (1536, "1.5 KiB"), (64 << 20, "64 MiB"), (3 << 30, "3 GiB")]
)
def test_fmt_bytes(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


def test_fmt_num_marks_missing_figures() -> None:
    assert fmt_num(None) == "n/a"
    assert fmt_num(12.345, ".1f", "x") == "12.3x"


def test_stdout_to_stderr_moves_file_descriptor_writes(capfd: pytest.CaptureFixture[str]) -> None:
    with stdout_to_stderr():
        print("from python")
        os.write(1, b"from fd 1\n")
    print("after")

    out, err = capfd.readouterr()
    assert out == "after\n"
    assert "from python" in err
    assert "from fd 1" in err
