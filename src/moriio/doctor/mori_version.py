"""``moriio doctor``'s line on the installed mori: release or nightly, and whether it is new enough.

Read from the package metadata (``amd-mori``, or ``amd-mori-nightly``), without importing mori.
The ``MORI_IO_*`` overrides moriio models exist from 1.2.2 (the package's floor); 1.2.4 adds
what moriio uses when present: ``IOEngine.pop_peer_failure()`` (peer-failure events),
``IOEngineSession.alive()`` (queue-pair liveness), retirement of endpoints after a fatal NIC
event, and the retry-budget variables ``MORI_IO_QP_TIMEOUT`` / ``MORI_IO_QP_RETRY_CNT``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from moriio.doctor.checks import Check, Status

DISTRIBUTIONS = ("amd-mori", "amd-mori-nightly")
MINIMUM = (1, 2, 2)
RECOMMENDED = (1, 2, 4)
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def installed_mori(lookup: Callable[[str], str] = version) -> tuple[str, str] | None:
    """(distribution, version) of the installed mori package, if any."""
    for name in DISTRIBUTIONS:
        try:
            return name, lookup(name)
        except PackageNotFoundError:
            continue
    return None


def mori_version_check(found: tuple[str, str] | None) -> Check | None:
    """The doctor line for ``found`` (None: mori is not installed, and no line is shown)."""
    if found is None:
        return None
    name, text = found
    nightly = name.endswith("-nightly") or ".dev" in text
    kind = "nightly" if nightly else "release"
    match = _RELEASE.match(text)
    if match is None:
        return Check("mori version", Status.WARN, f"{name} {text}: unrecognised version")
    release = tuple(int(part) for part in match.groups())
    detail = f"{name} {text} ({kind})"
    if release < MINIMUM:
        return Check(
            "mori version",
            Status.FAIL,
            f"{detail}: moriio needs amd-mori >= 1.2.2 (the MORI_IO_* settings it models)",
        )
    if release < RECOMMENDED:
        return Check(
            "mori version",
            Status.WARN,
            f"{detail}: below 1.2.4, mori reports no peer failures or dead queue pairs and "
            "has a fixed retry budget; a NIC fault is noticed only when a transfer fails",
        )
    return Check("mori version", Status.PASS, detail)
