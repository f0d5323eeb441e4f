"""The e2e tests in an order that lets pytest-xdist's two workers end together (``make test`` budget).

``--dist worksteal`` gives worker i the i-th share of the collection by count, each run in order, and
lets an idle worker steal the back half of the busiest worker's queue; it cannot take a test that has
started, nor a queue's last two. In file order a 245 s scenario could start last on one worker while
the other sat idle. Here the tests are dealt to the shares longest first (each to the share with the
least expected time, at the count xdist will cut it at), so each worker starts with its longest tests
and ends with short ones, which is the part stealing rebalances.

Expected times come from the last run on this checkout (the pytest cache, ``e2e/durations``), else
from ``durations.json`` beside this file (a fresh clone, CI); a test in neither counts as
``DEFAULT_SECONDS``. The tests of a module with a module- or class-scoped fixture that tears down
stay together in their own order, so that fixture is set up once per worker.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).with_name("durations.json")
CACHE_KEY = "e2e/durations"
#: The mean of the tests not in durations.json (a CI run's e2e worker time less the listed tests'):
#: most wait one or two operator cycles; chart renders take a second or two.
DEFAULT_SECONDS = 20.0
_SHARED_SCOPES = frozenset({"module", "class", "package"})


@dataclass
class _Unit:
    items: list[pytest.Item]
    seconds: float


@dataclass
class _Share:
    quota: int  # how many tests xdist will hand this worker at the start
    units: list[_Unit] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(u.items) for u in self.units)

    @property
    def seconds(self) -> float:
        return sum(u.seconds for u in self.units)


def load_durations(cached: Mapping[str, float] | None) -> dict[str, float]:
    """The checked-in durations, overridden by the cached ones of the last run here."""
    durations: dict[str, float] = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    durations.update(cached or {})
    return durations


def _shares_fixtures(item: pytest.Item) -> bool:
    """Whether the item uses a module- or class-scoped fixture with a teardown (a generator): split,
    its module would set it up and tear it down more than once (test_chaos_e2e.py's table)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        d.scope in _SHARED_SCOPES and inspect.isgeneratorfunction(d.func)
        for defs in info.name2fixturedefs.values()
        for d in defs
    )


def _units(items: Sequence[pytest.Item], durations: Mapping[str, float]) -> list[_Unit]:
    grouped: dict[str, _Unit] = {}
    units: list[_Unit] = []
    for item in items:
        seconds = durations.get(item.nodeid, DEFAULT_SECONDS)
        module = item.nodeid.split("::", 1)[0]
        if module in grouped or _shares_fixtures(item):
            unit = grouped.get(module)
            if unit is None:
                unit = grouped[module] = _Unit([], 0.0)
                units.append(unit)
            unit.items.append(item)
            unit.seconds += seconds
        else:
            units.append(_Unit([item], seconds))
    return units


def balanced_order(
    items: Sequence[pytest.Item], durations: Mapping[str, float], workers: int
) -> list[pytest.Item]:
    """``items`` as ``workers`` consecutive shares of xdist's sizes (the first ``n // workers``, ...),
    balanced by expected time, each longest first. Groups are placed first (they only fit where a
    share has room for all of them), then single tests, longest first, each to the share with the
    least time that has room."""
    shares = [_Share(0) for _ in range(max(workers, 1))]
    # xdist hands the first worker len(pending) // workers, the next a share of what is left, ...
    left = len(items)
    for i, share in enumerate(shares):
        share.quota = left // (len(shares) - i)
        left -= share.quota
    units = _units(items, durations)
    order = {id(u): i for i, u in enumerate(units)}
    placing = sorted(units, key=lambda u: (len(u.items) == 1, -u.seconds, order[id(u)]))
    for unit in placing:
        room = [s for s in shares if s.quota - s.count >= len(unit.items)] or shares
        min(room, key=lambda s: s.seconds).units.append(unit)
    result: list[pytest.Item] = []
    for share in shares:
        share.units.sort(key=lambda u: (-u.seconds, order[id(u)]))
        result.extend(item for unit in share.units for item in unit.items)
    return result
