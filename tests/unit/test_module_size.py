"""Modules stay small enough to read in one sitting: none over 400 lines."""

from __future__ import annotations

from pathlib import Path

import moriio

MAX_LINES = 400


def test_no_module_is_longer_than_the_limit() -> None:
    root = Path(moriio.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 50  # the package was found, not an empty folder
    too_long = {
        str(path.relative_to(root)): n
        for path in modules
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert too_long == {}
