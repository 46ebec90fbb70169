"""``moriio doctor`` reports the installed mori (release or nightly) and warns below 1.2.4."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

import pytest

from moriio.doctor.checks import Status
from moriio.doctor.mori_version import installed_mori, mori_version_check


@pytest.mark.parametrize(
    ("found", "status", "words"),
    [
        (("amd-mori", "1.2.4"), Status.PASS, "(release)"),
        (("amd-mori-nightly", "1.2.5.dev20261026"), Status.PASS, "(nightly)"),
        (("amd-mori", "1.2.3.post1"), Status.WARN, "below 1.2.4"),
        (("amd-mori", "1.2.2"), Status.WARN, "no peer failures"),
        (("amd-mori", "1.1.1"), Status.FAIL, ">= 1.2.2"),
        (("amd-mori", "unknown"), Status.WARN, "unrecognised"),
    ],
)
def test_the_installed_mori_is_judged_by_its_version(
    found: tuple[str, str], status: Status, words: str
) -> None:
    check = mori_version_check(found)
    assert check is not None
    assert check.status is status
    assert words in check.detail
    assert found[1] in check.detail


def test_the_nightly_is_found_when_no_release_is_installed() -> None:
    def lookup(name: str) -> str:
        if name == "amd-mori-nightly":
            return "1.2.5.dev20261026"
        raise PackageNotFoundError(name)

    assert installed_mori(lookup) == ("amd-mori-nightly", "1.2.5.dev20261026")


def test_no_line_without_mori() -> None:
    def lookup(name: str) -> str:
        raise PackageNotFoundError(name)

    assert installed_mori(lookup) is None
    assert mori_version_check(None) is None
