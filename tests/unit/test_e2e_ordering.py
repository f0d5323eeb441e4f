"""The e2e order xdist's worksteal shares are cut from: balanced, longest first, groups kept whole."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.e2e.ordering import DEFAULT_SECONDS, balanced_order


def _table() -> Iterator[list[str]]:
    yield []


def _helm() -> str:
    return "helm"


@dataclass
class _Def:
    scope: str
    func: Callable[..., Any] = _table


@dataclass
class _Info:
    name2fixturedefs: dict[str, list[_Def]] = field(default_factory=dict)


@dataclass
class _Item:
    nodeid: str
    _fixtureinfo: _Info = field(default_factory=_Info)


def _items(*specs: str | tuple[str, str]) -> list[pytest.Item]:
    out: list[Any] = []
    for spec in specs:
        if isinstance(spec, tuple):
            scope, _, plain = spec[1].partition(":")
            out.append(_Item(spec[0], _Info({"f": [_Def(scope, _helm if plain else _table)]})))
        else:
            out.append(_Item(spec))
    return cast(list[pytest.Item], out)


def _ids(items: list[pytest.Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_two_shares_of_xdists_sizes_balanced_and_each_longest_first() -> None:
    items = _items(*(f"m.py::t{i}" for i in range(7)))
    seconds = {f"m.py::t{i}": float(s) for i, s in enumerate([10, 245, 30, 175, 174, 5, 60])}
    order = _ids(balanced_order(items, seconds, workers=2))
    first, second = order[: 7 // 2], order[7 // 2 :]  # xdist: len // 2, then the rest
    assert first[0] == "m.py::t1"  # the two longest start at once
    assert second[0] == "m.py::t3"
    for share in (first, second):
        assert [seconds[i] for i in share] == sorted((seconds[i] for i in share), reverse=True)
    totals = [sum(seconds[i] for i in share) for share in (first, second)]
    assert abs(totals[0] - totals[1]) <= 60, totals
    assert sorted(order) == sorted(_ids(items))


def test_file_order_would_leave_one_worker_with_the_long_tail() -> None:
    """The positive control: xdist's cut of the file order puts the three long tests on one worker."""
    items = _items(
        "a.py::short1", "a.py::short2", "a.py::short3", "b.py::long1", "b.py::long2", "b.py::long3"
    )
    seconds = {"b.py::long1": 200.0, "b.py::long2": 200.0, "b.py::long3": 200.0}
    order = _ids(balanced_order(items, seconds, workers=2))
    longs_in_first_share = sum(i.startswith("b.py") for i in order[:3])
    assert longs_in_first_share in (1, 2)
    assert sum(i.startswith("b.py") for i in _ids(items)[:3]) == 0  # the file order's cut: all on gw1


def test_a_module_with_a_module_fixture_stays_whole_and_in_its_own_order() -> None:
    items = _items(
        ("chaos.py::c1", "module"),
        ("chaos.py::c2", "module"),
        ("chaos.py::c3", "module"),
        "x.py::long",
        "x.py::a",
        "x.py::b",
    )
    seconds = {"chaos.py::c3": 300.0, "x.py::long": 250.0}
    order = _ids(balanced_order(items, seconds, workers=2))
    start = order.index("chaos.py::c1")
    assert order[start : start + 3] == ["chaos.py::c1", "chaos.py::c2", "chaos.py::c3"]


def test_a_module_fixture_without_teardown_does_not_hold_its_module_together() -> None:
    items = _items(("chart.py::a", "module:plain"), ("chart.py::b", "module:plain"), "x.py::long")
    seconds = {"chart.py::b": 100.0, "x.py::long": 250.0}
    assert _ids(balanced_order(items, seconds, workers=1)) == ["x.py::long", "chart.py::b", "chart.py::a"]


def test_one_worker_runs_longest_first_and_unknown_tests_count_as_the_default() -> None:
    items = _items("m.py::known_short", "m.py::unknown", "m.py::known_long")
    seconds = {"m.py::known_short": DEFAULT_SECONDS / 2, "m.py::known_long": DEFAULT_SECONDS * 2}
    assert _ids(balanced_order(items, seconds, workers=1)) == [
        "m.py::known_long",
        "m.py::unknown",
        "m.py::known_short",
    ]
