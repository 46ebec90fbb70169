"""Layer gates on a stream: a forward queued after a closing never passes on a gate opened for
an earlier one, however far the device lags behind the host; opening waits for the closing
to have run; a gate no forward waited on is never reopened for a later forward.

The device is :class:`moriio.testing.fake_stream.FakeStream`: work runs only when the test says.
"""

from __future__ import annotations

import numpy as np
import pytest

from moriio.testing.fake_stream import BASE_ADDRESS, FakeStream

pytest.importorskip("torch")

from moriio.adapters.device.stream_gates import StreamGates, probe_stream_gates


def _gates(count: int = 2) -> tuple[StreamGates, FakeStream]:
    stream = FakeStream(count)
    return StreamGates(stream, stream.words, BASE_ADDRESS, lambda: 0), stream


def _forward(
    gates: StreamGates, stream: FakeStream, layer: int, seen: list[str], name: str
) -> None:
    """A forward's attention for ``layer``: wait on its gate, then read (record) the KV."""
    gates.enqueue_wait(layer)
    stream.kernel(lambda: seen.append(name))


def test_gates_start_open_so_a_forward_with_nothing_to_load_never_waits() -> None:
    gates, stream = _gates()
    seen: list[str] = []
    _forward(gates, stream, 0, seen, "f0")
    assert stream.run()
    assert seen == ["f0"]


def test_a_lagging_device_never_passes_a_later_forward_on_an_earlier_opening() -> None:
    gates, stream = _gates()
    seen: list[str] = []
    first = gates.close_all()
    _forward(gates, stream, 0, seen, "f1")
    second = gates.close_all()  # queued while the device has not even begun the first
    _forward(gates, stream, 0, seen, "f2")
    assert gates.try_open(0, first) is False  # the first closing has not run yet
    assert not stream.run()
    assert seen == []
    assert gates.try_open(0, first) is True
    assert not stream.run()
    assert seen == ["f1"]
    assert gates.try_open(0, second) is True
    assert stream.run()
    assert seen == ["f1", "f2"]


def test_opening_before_the_closing_ran_is_refused_not_lost() -> None:
    """Control for the numbering: a plain flag opened early is closed again by the
    stream-ordered closing, and the forward would wait for good."""
    gates, stream = _gates(1)
    seen: list[str] = []
    closing = gates.close_all()
    _forward(gates, stream, 0, seen, "f1")
    assert gates.try_open(0, closing) is False
    stream.words[0] |= 1  # what an unnumbered gate would do: open now
    assert not stream.run()
    assert seen == []
    assert gates.try_open(0, closing) is True
    assert stream.run()
    assert seen == ["f1"]


def test_a_gate_no_forward_waited_on_is_not_reopened_for_a_later_forward() -> None:
    """Forward 1 never waits on gate 1 (a layer whose hook did not run). Its opening, late,
    must not open the gate forward 2 waits on."""
    gates, stream = _gates()
    seen: list[str] = []
    first = gates.close_all()
    _forward(gates, stream, 0, seen, "f1")
    second = gates.close_all()
    _forward(gates, stream, 1, seen, "f2")
    assert gates.try_open(0, first) is False
    stream.run()
    assert gates.try_open(0, first) is True
    assert not stream.run()
    assert seen == ["f1"]
    assert gates.try_open(1, first) is True  # nothing to open: a later closing ran
    assert not stream.run()
    assert seen == ["f1"]
    assert gates.try_open(1, second) is True
    assert stream.run()
    assert seen == ["f1", "f2"]


def test_open_all_releases_a_waiting_forward() -> None:
    gates, stream = _gates()
    seen: list[str] = []
    gates.close_all()
    _forward(gates, stream, 1, seen, "f1")
    assert not stream.run()
    gates.open_all()
    assert stream.run()
    assert seen == ["f1"]


def test_closing_numbers_wrap_around_32_bits() -> None:
    gates, stream = _gates(1)
    gates._closings = (1 << 31) - 2  # near the top of the flag's range
    for _ in range(4):
        seen: list[str] = []
        closing = gates.close_all()
        _forward(gates, stream, 0, seen, "f")
        assert not stream.run()
        assert seen == []
        assert gates.try_open(0, closing) is True
        assert stream.run()
        assert seen == ["f"]
    assert int(stream.words[0]) < 16  # it did wrap


def test_flags_must_be_32_bit_words() -> None:
    stream = FakeStream(1)
    with pytest.raises(ValueError, match="uint32"):
        StreamGates(stream, np.zeros(1, dtype=np.int64), BASE_ADDRESS, lambda: 0)


def test_the_probe_refuses_a_device_without_stream_memory_operations() -> None:
    import torch

    reason = probe_stream_gates(torch.device("cpu"), 4)
    assert isinstance(reason, str)
    assert "cpu" in reason


class RacyFlags(np.ndarray):
    """Gate flags where the device writes right after the host's next read (``on_read``)."""

    on_read: object = None

    def __getitem__(self, key: object) -> object:
        value = super().__getitem__(key)
        hook, self.on_read = self.on_read, None
        if callable(hook):
            hook()
        return value


def test_a_closing_landing_between_the_host_s_read_and_write_is_not_undone() -> None:
    """Forward 1 never waits on gate 0, so closing 2 can land while the host opens gate 0
    for closing 1: a read-then-write would open the gate forward 2 waits on."""
    stream = FakeStream(2)
    stream.words = stream.words.view(RacyFlags)
    gates = StreamGates(stream, stream.words, BASE_ADDRESS, lambda: 0)
    seen: list[str] = []
    first = gates.close_all()
    assert stream.run()  # closing 1 ran: gate 0 reads 2
    second = gates.close_all()
    _forward(gates, stream, 0, seen, "f2")
    stream.words.on_read = stream.run  # closing 2 lands right after the host reads
    assert gates.try_open(0, first) is True  # nothing to open for closing 1 any more
    assert not stream.run()
    assert seen == []  # forward 2 still waits for its own opening
    assert gates.try_open(0, second) is True
    assert stream.run()
    assert seen == ["f2"]


def test_a_wait_on_another_stream_is_ordered_after_the_closing() -> None:
    """Micro-batches: the forward is armed on stream A, a layer runs on stream B. B must not
    pass the gate on the previous forward's opening before A's closing ran."""
    stream = FakeStream(1)
    current = [0]
    gates = StreamGates(stream, stream.words, BASE_ADDRESS, lambda: current[0])
    seen: list[str] = []
    first = gates.close_all()
    _forward(gates, stream, 0, seen, "f1")
    assert not stream.run()
    assert gates.try_open(0, first) is True
    assert stream.run()
    assert seen == ["f1"]
    gates.close_all()  # queued on stream A (0), not run yet
    current[0] = 1  # the next forward's layer runs on stream B
    gates.enqueue_wait(0)
    stream.kernel(lambda: seen.append("f2"), stream=1)
    stream.run(order=[1])  # the device gets to stream B first
    assert seen == ["f1"]  # B waits for A's closing, then for the gate


def test_open_all_opens_for_the_latest_closing() -> None:
    gates, stream = _gates(1)
    for _ in range(3):
        gates.close_all()
    gates.open_all()
    assert int(stream.words[0]) == 2 * 3 + 1
