import pytest

from moriio.domain.ledgers.terminal_ids import TerminalIds


def test_terminal_ids_evict_the_oldest_and_count_it() -> None:
    ids = TerminalIds(capacity=2)
    ids.add("a")
    ids.add("b")
    ids.add("a")  # refresh: "b" is now the oldest
    ids.add("c")
    assert "a" in ids
    assert "c" in ids
    assert "b" not in ids
    assert ids.evictions == 1
    assert len(ids) == 2


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        TerminalIds(capacity=0)
