"""Figures the documentation derives from defaults, checked against the code that sets them.

Each entry is a phrase of a document with ``{}`` where the figure goes; the figure is computed
from the defaults the production path uses (a :class:`TransferPolicy` built from default
:class:`ConnectorSettings` as the container builds it, the router's and the tools' defaults).
A changed default fails here, naming the phrase to update.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from moriio.cli.main import build_parser, load_tool
from moriio.config.settings import ConnectorSettings
from moriio.container import _policy
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.wire.messages import PROTOCOL_VERSION
from moriio.domain.worker.liveness import (
    PROBES_PER_TIMEOUT,
    READ_PRODUCER_SILENCE,
    WRITE_PRODUCER_SILENCE,
)
from moriio.router.registry import DEFAULT_STALE_AFTER_S

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ConnectorSettings()
POLICY = _policy(SETTINGS)
WRITE_FENCE_TERMS = (
    "defer_timeout",
    "transfer_timeout",
    "quarantine_timeout",
    "clock_skew_allowance",
)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _ms(value: float) -> str:
    return f"{value * 1000:g}"


def _bench_default(flag: str) -> object:
    args = build_parser({"bench": load_tool("bench")}).parse_args(["bench"])
    return getattr(args, flag)


# (document, phrase with "{}" for the figure, the figure from the code)
FIGURES: list[tuple[str, str, Callable[[], object]]] = [
    # the WRITE fence, and the leases
    (
        "docs/deploying.md",
        "quarantine_timeout + clock_skew_allowance`, {} s by default",
        lambda: _seconds(POLICY.write_fence(0.0)),
    ),
    (
        "docs/deploying.md",
        "(`defer_timeout + clock_skew_allowance`, {} s)",
        lambda: _seconds(POLICY.defer_timeout + POLICY.clock_skew_allowance),
    ),
    (
        "docs/deploying.md",
        "lease ends (`defer_timeout`, {} s)",
        lambda: _seconds(POLICY.defer_timeout),
    ),
    (
        "docs/deploying.md",
        "default lease leaves a READ to start ({} s less the {} s\ntransfer timeout",
        lambda: (_seconds(POLICY.defer_timeout), _seconds(POLICY.transfer_timeout)),
    ),
    (
        "docs/troubleshooting.md",
        "## Requests stall about {} s",
        lambda: _seconds(POLICY.defer_timeout),
    ),
    (
        "docs/troubleshooting.md",
        "Raise `defer_timeout` (default {} s) or\nlower `transfer_timeout` (default {} s) or "
        "`clock_skew_allowance` (default {} s)",
        lambda: tuple(
            _seconds(getattr(POLICY, k))
            for k in ("defer_timeout", "transfer_timeout", "clock_skew_allowance")
        ),
    ),
    (
        "docs/security.md",
        "| `defer_timeout`, `transfer_timeout`, `clock_skew_allowance` | {} s, {} s, {} s |",
        lambda: tuple(
            _seconds(getattr(POLICY, k))
            for k in ("defer_timeout", "transfer_timeout", "clock_skew_allowance")
        ),
    ),
    # backpressure retries
    (
        "docs/troubleshooting.md",
        "re-posts after {} ms, doubling to {} ms",
        lambda: (_ms(POLICY.backoff_initial), _ms(POLICY.backoff_max)),
    ),
    # liveness
    (
        "docs/deploying.md",
        "every `liveness_timeout / 4` ({} s by default, so every {} s)",
        lambda: (
            _seconds(POLICY.liveness_timeout),
            _seconds(POLICY.liveness_timeout / PROBES_PER_TIMEOUT),
        ),
    ),
    (
        "docs/deploying.md",
        "after `liveness_timeout` ({} s)",
        lambda: _seconds(POLICY.liveness_timeout),
    ),
    (
        "docs/deploying.md",
        "after `{} \N{MULTIPLICATION SIGN} liveness_timeout` ({} s)",
        lambda: (
            _seconds(READ_PRODUCER_SILENCE),
            _seconds(READ_PRODUCER_SILENCE * POLICY.liveness_timeout),
        ),
    ),
    # the worker's waits, the router, the tools
    (
        "docs/deploying.md",
        "every `progress_interval` ({} ms)",
        lambda: _ms(SETTINGS.progress_interval),
    ),
    ("docs/deploying.md", "`idle_step_wait` ({} ms)", lambda: _ms(SETTINGS.idle_step_wait)),
    (
        "docs/performance.md",
        "[`idle_step_wait`](configuration.md) ({} ms)",
        lambda: _ms(SETTINGS.idle_step_wait),
    ),
    (
        "docs/deploying.md",
        "(every `proxy_ping_interval`, {} s)",
        lambda: _seconds(SETTINGS.proxy_ping_interval),
    ),
    (
        "docs/deploying.md",
        "every `proxy_ping_interval` seconds ({} by default",
        lambda: _seconds(SETTINGS.proxy_ping_interval),
    ),
    (
        "docs/deploying.md",
        "`--stale-after` seconds ({} by default",
        lambda: _seconds(DEFAULT_STALE_AFTER_S),
    ),
    ("docs/deploying.md", "`--stale-after` seconds ({})", lambda: _seconds(DEFAULT_STALE_AFTER_S)),
    (
        "docs/deploying.md",
        "(`--request-timeout`, {} s)",
        lambda: _seconds(float(str(_bench_default("request_timeout")))),
    ),
    (
        "docs/troubleshooting.md",
        "outside that range (the defaults, {} and {}, are)",
        lambda: (SETTINGS.handshake_port, SETTINGS.notify_port),
    ),
    # the wire protocol
    ("docs/security.md", "Wire protocol version {}.", lambda: PROTOCOL_VERSION),
    ("docs/security.md", "this peer speaks {}`", lambda: PROTOCOL_VERSION),
    ("CHANGELOG.md", "Wire protocol: **{}**.", lambda: PROTOCOL_VERSION),
]


def _text(document: str) -> str:
    return (ROOT / document).read_text()


@pytest.mark.parametrize(
    ("document", "phrase", "figure"), FIGURES, ids=[f"{d}: {p[:40]}" for d, p, _ in FIGURES]
)
def test_the_documented_figure_is_the_codes(
    document: str, phrase: str, figure: Callable[[], object]
) -> None:
    value = figure()
    expected = phrase.format(*(value if isinstance(value, tuple) else (value,)))
    assert expected in _text(document), f"{document} should say: {expected!r}"


def test_the_write_fence_adds_the_terms_the_documents_name() -> None:
    """Each term the documented formula names moves the fence by its own change, and no
    other setting does."""
    base = POLICY.write_fence(0.0)
    moving = {
        name
        for name in (*WRITE_FENCE_TERMS, "liveness_timeout", "backoff_max")
        if replace(POLICY, **{name: getattr(POLICY, name) + 1.0}).write_fence(0.0) == base + 1.0
    }
    assert moving == set(WRITE_FENCE_TERMS)
    formula = " + ".join(WRITE_FENCE_TERMS)
    for document in ("docs/deploying.md", "docs/troubleshooting.md"):
        assert formula in " ".join(_text(document).split()), document


def test_the_changelogs_latest_release_speaks_the_codes_protocol() -> None:
    releases = re.findall(
        r"^## (\S+).*\n\nWire protocol: \*\*(\d+)\*\*", _text("CHANGELOG.md"), re.M
    )
    assert releases, "CHANGELOG.md names no release with its wire protocol"
    assert int(releases[0][1]) == PROTOCOL_VERSION


def test_the_policy_the_container_builds_keeps_the_settings_defaults() -> None:
    from_settings = TransferPolicy(
        transfer_timeout=SETTINGS.transfer_timeout,
        defer_timeout=SETTINGS.defer_timeout,
        clock_skew_allowance=SETTINGS.clock_skew_allowance,
        quarantine_timeout=SETTINGS.quarantine_timeout,
        liveness_timeout=SETTINGS.liveness_timeout,
    )
    assert from_settings == POLICY
    assert WRITE_PRODUCER_SILENCE == READ_PRODUCER_SILENCE  # deploying.md: "the same bound"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_documents_resolve() -> None:
    documents = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    prose = {d: re.sub(r"```.*?```", "", d.read_text(), flags=re.S) for d in documents}
    anchors = {d: {_anchor(h) for h in re.findall(r"^#+ (.*)$", t, re.M)} for d, t in prose.items()}
    broken = []
    for document, text in prose.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            destination = (document.parent / path).resolve() if path else document
            known = anchors.get(destination)
            if not destination.exists() or (anchor and known is not None and anchor not in known):
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert broken == []
