"""The aggregate row: one signal's window aggregates as a fixed-order list of floats.

Defined once here because two modules read and write it by position: the Prometheus source folds
each answer's ``SIGNAL:agg`` series into rows (``prometheus/windows.py``), and the activity cache
keeps rows between cycles as packed doubles (``tiered/activity_cache.py``). NaN marks an aggregate that
was not returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gpu_efficiency.engine.model import Signal, Stats

#: The aggregates of a row, in order; the names are the ``agg`` part of a series' ``SIGNAL:agg`` tag.
FIELDS = ("avg", "max", "min", "last", "count", "ts", "stddev", "changes", "resets")
WIDTH = len(FIELDS)
#: Where the activity cache reads a row.
AVG, MAX, COUNT, TS = (FIELDS.index(name) for name in ("avg", "max", "count", "ts"))


def row_stats(row: Sequence[float]) -> Stats:
    """One signal's row as Stats (counts NaN when not returned: 0)."""
    avg, max_, min_, last, count, ts, stddev, changes, resets = row
    isfinite = math.isfinite
    return Stats(
        avg,
        max_,
        min_,
        last,
        int(count) if isfinite(count) else 0,
        ts,
        stddev,
        int(changes) if isfinite(changes) else 0,
        int(resets) if isfinite(resets) else 0,
    )


def rows_stats(rows: Mapping[Signal, Sequence[float]]) -> dict[Signal, Stats]:
    return {signal: row_stats(row) for signal, row in rows.items()}
