"""Rolling history: bounded memory, window selection, and aggregates matching engine.model.Stats."""

from __future__ import annotations

import math

import pytest

from gpu_efficiency.agent.history import History, summarise


def test_capacity_bounds_memory_and_keeps_the_newest() -> None:
    h = History(["a"], capacity=4)
    for t in range(10):
        h.append(float(t), {"a": float(t)})
    assert len(h) == 4
    ts, cols = h.window(-math.inf)
    assert ts == [6.0, 7.0, 8.0, 9.0]
    assert cols["a"] == [6.0, 7.0, 8.0, 9.0]


def test_window_is_inclusive_and_ordered_oldest_first() -> None:
    h = History(["a", "b"], capacity=100)
    for t in range(10):
        h.append(100.0 + t, {"a": t} if t % 2 else {"a": t, "b": 1.0})
    ts, cols = h.window(105.0, 107.0)
    assert ts == [105.0, 106.0, 107.0]
    assert cols["a"] == [5.0, 6.0, 7.0]
    assert math.isnan(cols["b"][0])
    assert cols["b"][1] == 1.0


def test_summary_fields() -> None:
    s = summarise([1.0, 2.0, 3.0, 4.0, 5.0], [4.0, math.nan, 6.0, 2.0, 2.0])
    assert s is not None
    assert (s.count, s.first, s.last, s.min, s.max) == (4, 4.0, 2.0, 2.0, 6.0)
    assert s.avg == pytest.approx(3.5)
    assert s.stddev == pytest.approx(math.sqrt(((0.5**2) + (2.5**2) + 1.5**2 + 1.5**2) / 4))
    assert s.changes == 2  # 4->6, 6->2
    assert s.resets == 1  # 6->2 (a counter going down)
    assert s.last_timestamp == 5.0


def test_summary_of_nothing_is_none_and_stats_skip_empty_signals() -> None:
    assert summarise([1.0], [math.nan]) is None
    h = History(["a", "b"], capacity=10)
    h.append(1.0, {"a": 0.5})
    stats = h.stats(0.0, 2.0)
    assert set(stats) == {"a"}
    assert stats["a"].count == 1


def test_zero_capacity_rejected() -> None:
    with pytest.raises(ValueError, match="capacity"):
        History(["a"], 0)
