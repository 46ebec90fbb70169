from moriio.domain.timing.deadlines import DeadlineQueue


def test_pop_due_returns_keys_at_or_past_their_deadline_earliest_first() -> None:
    q: DeadlineQueue[str] = DeadlineQueue()
    q.set("b", 2.0)
    q.set("a", 1.0)
    q.set("c", 3.0)
    assert q.pop_due(0.5) == []
    assert q.pop_due(2.0) == ["a", "b"]
    assert len(q) == 1
    assert "c" in q
    assert q.next_deadline() == 3.0


def test_moved_and_discarded_keys_are_not_reported_at_their_old_deadline() -> None:
    q: DeadlineQueue[str] = DeadlineQueue()
    q.set("a", 1.0)
    q.set("b", 1.0)
    q.set("a", 5.0)
    q.discard("b")
    q.discard("missing")
    assert q.deadline("a") == 5.0
    assert q.deadline("b") is None
    assert q.next_deadline() == 5.0
    assert q.pop_due(4.0) == []
    assert q.pop_due(5.0) == ["a"]
    assert len(q) == 0
    assert q.next_deadline() is None


def test_heap_is_compacted_when_stale_entries_pile_up() -> None:
    q: DeadlineQueue[int] = DeadlineQueue()
    for i in range(1000):
        q.set(0, float(i))
    assert len(q) == 1
    assert len(q._heap) < 200
    assert q.pop_due(10_000.0) == [0]
