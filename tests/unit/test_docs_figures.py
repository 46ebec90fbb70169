"""Figures the documentation derives from defaults, checked against the code that sets them.

Each entry is a phrase of a document with ``{}`` where the figure goes; the figure is computed
from the defaults the production path uses (the :class:`TransferPolicy` of default
:class:`ConnectorSettings`, as both sides of the connector build it, the router's and the
tools' defaults). A sum of timeouts is the policy's own method, never added up here. A changed
default fails here, naming the phrase to update. Line breaks in a phrase match any spacing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from moriio.cli.main import build_parser, load_tool
from moriio.config.settings import ConnectorSettings
from moriio.domain.params.transfer_params import MAX_ENGINE_ID_LEN, MAX_REMOTE_ENGINE_ID_LEN
from moriio.domain.protocol.messages import PROTOCOL_VERSION
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.liveness import (
    PROBES_PER_TIMEOUT,
    READ_PRODUCER_SILENCE,
    WRITE_PRODUCER_SILENCE,
)
from moriio.domain.worker.progress import DEFAULT_IDLE_BLOCK, DEFAULT_IDLE_WAIT
from moriio.router.registry import DEFAULT_STALE_AFTER_S

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ConnectorSettings()
POLICY = SETTINGS.transfer_policy()
WRITE_FENCE_TERMS = (
    "defer_timeout",
    "transfer_timeout",
    "quarantine_timeout",
    "clock_skew_allowance",
)
RECLAIM_TERMS = ("defer_timeout", "clock_skew_allowance")


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
        "docs/configuration.md",
        "quarantine_timeout + clock_skew_allowance`, {} s by default",
        lambda: _seconds(POLICY.write_fence(0.0)),
    ),
    (
        "docs/deploying.md",
        "(`defer_timeout + clock_skew_allowance`, {} s)",
        lambda: _seconds(POLICY.reclaim_after),
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
            _seconds(POLICY.liveness_silence(READ_PRODUCER_SILENCE)),
        ),
    ),
    # the worker's waits, the router, the tools
    (
        "docs/deploying.md",
        "every `progress_interval` ({} ms)",
        lambda: _ms(SETTINGS.progress_interval),
    ),
    ("docs/deploying.md", "at the latest every {} ms to expire", lambda: _ms(DEFAULT_IDLE_WAIT)),
    ("docs/deploying.md", "(a {}-second safety bound)", lambda: _seconds(DEFAULT_IDLE_BLOCK)),
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
    # the params' caps
    (
        "docs/configuration.md",
        "`remote_engine_id` a string of up to {} characters or null, followed where a prefill "
        "returned it by its token and signature (up to {} more characters",
        lambda: (MAX_ENGINE_ID_LEN, MAX_REMOTE_ENGINE_ID_LEN - MAX_ENGINE_ID_LEN),
    ),
    # the wire protocol
    ("docs/security.md", "Wire protocol version {}.", lambda: PROTOCOL_VERSION),
    ("docs/security.md", "this peer speaks {}`", lambda: PROTOCOL_VERSION),
    ("CHANGELOG.md", "Wire protocol: **{}**.", lambda: PROTOCOL_VERSION),
]


def _text(document: str) -> str:
    return (ROOT / document).read_text()


def _flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks too) as one space."""
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("document", "phrase", "figure"), FIGURES, ids=[f"{d}: {p[:40]}" for d, p, _ in FIGURES]
)
def test_the_documented_figure_is_the_codes(
    document: str, phrase: str, figure: Callable[[], object]
) -> None:
    value = figure()
    expected = _flat(phrase.format(*(value if isinstance(value, tuple) else (value,))))
    assert expected in _flat(_text(document)), f"{document} should say: {expected!r}"


@pytest.mark.parametrize(
    ("figure", "terms", "documents"),
    [
        (
            lambda p: p.write_fence(0.0),
            WRITE_FENCE_TERMS,
            ("docs/deploying.md", "docs/troubleshooting.md", "docs/configuration.md"),
        ),
        (lambda p: p.reclaim_after, RECLAIM_TERMS, ("docs/deploying.md",)),
    ],
    ids=["write fence", "reclaim"],
)
def test_a_documented_sum_adds_the_terms_the_documents_name(
    figure: Callable[[TransferPolicy], float], terms: tuple[str, ...], documents: tuple[str, ...]
) -> None:
    """Each term the documented formula names moves the figure by its own change, and no
    other setting does."""
    base = figure(POLICY)
    others = ("transfer_timeout", "quarantine_timeout", "liveness_timeout", "backoff_max")
    moving = {
        name
        for name in {*terms, *others}
        if figure(replace(POLICY, **{name: getattr(POLICY, name) + 1.0})) == base + 1.0
    }
    assert moving == set(terms)
    formula = " + ".join(terms)
    for document in documents:
        assert formula in _flat(_text(document)), document


def test_the_changelogs_latest_release_speaks_the_codes_protocol() -> None:
    releases = re.findall(
        r"^## (\S+).*\n\nWire protocol: \*\*(\d+)\*\*", _text("CHANGELOG.md"), re.M
    )
    assert releases, "CHANGELOG.md names no release with its wire protocol"
    assert int(releases[0][1]) == PROTOCOL_VERSION


def test_the_settings_policy_keeps_the_settings_defaults() -> None:
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
