"""Every sum of timeouts has one owner, so that no deadline drifts from the one documented.

:class:`TransferPolicy` computes every deadline and lease check built from the connector's
timeouts; ``PeerDirectory.handshake_wait_deadline`` the one built from ``handshake_timeout``.
A code line elsewhere in ``src/moriio`` (comments and strings aside) that adds, subtracts or
multiplies a timeout by hand fails here, naming its file and line. The simulation
(``moriio_tools.sim``, outside the library) keeps its own bounds: an oracle's, stated
independently of the code they check.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import moriio

PACKAGE = Path(moriio.__file__).parent
OWNER = "domain/timing/policy.py"
PEERS = "domain/worker/peers.py"
PEERS_OWNER = "handshake_wait_deadline"

_TIMEOUT = r"[\w.]*(?:_timeout|skew_allowance)\b"
HAND_SUM = re.compile(rf"\b{_TIMEOUT}\s*[-+*]|[-+*]=?\s*{_TIMEOUT}")


def _code_lines(source: str) -> list[str]:
    """``source``'s lines with every comment and string (docstrings too) blanked out."""
    lines = [list(line) for line in source.splitlines()]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        (first, start), (last, end) = token.start, token.end
        for row in range(first, last + 1):
            line = lines[row - 1]
            lo = start if row == first else 0
            hi = end if row == last else len(line)
            line[lo:hi] = " " * (hi - lo)
    return ["".join(line) for line in lines]


def hand_sums(source: str, skip: frozenset[int] = frozenset()) -> list[int]:
    """The 1-based numbers of the lines of ``source`` that do arithmetic on a timeout."""
    return [
        number
        for number, line in enumerate(_code_lines(source), start=1)
        if number not in skip and HAND_SUM.search(line)
    ]


def _owned_lines(source: str, function: str) -> frozenset[int]:
    """The lines of ``function`` (a method of ``source``), whose sums it owns."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return frozenset(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    raise AssertionError(f"{PEERS} has no {function}")


def test_no_timeout_is_summed_outside_its_owner() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == OWNER:
            continue
        source = path.read_text(encoding="utf-8")
        skip = _owned_lines(source, PEERS_OWNER) if name == PEERS else frozenset()
        found += [f"src/moriio/{name}:{n}" for n in hand_sums(source, skip)]
    assert found == [], "timeout arithmetic outside TransferPolicy: " + ", ".join(found)


def test_the_owners_are_where_the_scan_expects_them() -> None:
    policy = (PACKAGE / OWNER).read_text(encoding="utf-8")
    assert hand_sums(policy)  # the policy's own sums are what the scan would catch
    peers = (PACKAGE / PEERS).read_text(encoding="utf-8")
    owned = _owned_lines(peers, PEERS_OWNER)
    assert set(hand_sums(peers)) <= owned


@pytest.mark.parametrize(
    "line",
    [
        "deadline = now + policy.defer_timeout + policy.clock_skew_allowance",
        "if wall_now + policy.transfer_timeout + skew > expires:",
        "write_by=ctx.wall_now() + policy.defer_timeout,",
        "save = Push(order, deadline=now + ctx.policy.defer_timeout, forward=self.forward)",
        "tid, dest.reply_to, tid, ctx.clock.now() + 2 * peers.handshake_timeout",
        "deadline = parked.at + 2 * ctx.peers.handshake_timeout",
        "self._clock.now() + self._policy.quarantine_timeout,",
        "self._reclaim_after = defer_timeout + clock_skew_allowance",
        "if wall_now + skew_allowance >= dest.write_by:",
        "return self._returned.for_transfer(tid, ids, wall_now + self._defer_timeout, token)",
        "self._claims = ConsumerClaims(ctx.policy.liveness_timeout * self.consumer_silence)",
        "if settings.defer_timeout <= settings.transfer_timeout + settings.clock_skew_allowance:",
        "deadline += policy.transfer_timeout",
        "since = now - self._timeout",
    ],
)
def test_a_hand_written_sum_is_caught(line: str) -> None:
    assert hand_sums(f"def f():\n    {line}\n") == [2]


@pytest.mark.parametrize(
    "line",
    [
        "deadline = policy.read_hold_deadline(now)  # now + defer_timeout + transfer_timeout",
        'reason = "wait defer_timeout + clock_skew_allowance"',
        '"""Until ``write_by + transfer_timeout``."""',
        "deadline = time.monotonic() + timeout  # a wait of its own, no setting",
        "suspect = min(suspect_timeout or handshake_timeout, handshake_timeout)",
    ],
)
def test_comments_strings_and_other_waits_are_not_sums_of_timeouts(line: str) -> None:
    assert hand_sums(f"def f():\n    {line}\n") == []
