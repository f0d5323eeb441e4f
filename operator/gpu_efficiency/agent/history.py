"""A bounded rolling history per GPU and the window aggregates the operator asks for.

Memory is fixed at start: one ``array('d')`` per signal of ``capacity`` slots (15 min at 1 Hz, 21 signals:
about 150 kB per GPU). Absent values are NaN. Aggregation runs on the agent, so the operator receives a
few numbers per signal and window instead of every sample from every node.
"""

from __future__ import annotations

import itertools
import math
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Same fields and meaning as ``engine.model.Stats`` (kept separate so the agent needs no pydantic)."""

    avg: float
    max: float
    min: float
    last: float
    count: int
    last_timestamp: float
    stddev: float
    changes: int
    resets: int
    first: float


def summarise(timestamps: Sequence[float], values: Sequence[float]) -> WindowStats | None:
    """Aggregate one signal over samples ordered oldest first; NaN values are skipped."""
    present = [(t, v) for t, v in zip(timestamps, values, strict=True) if v == v]
    if not present:
        return None
    vs = [v for _, v in present]
    n = len(vs)
    mean = math.fsum(vs) / n
    pairs = list(itertools.pairwise(vs))
    return WindowStats(
        avg=mean,
        max=max(vs),
        min=min(vs),
        last=vs[-1],
        count=n,
        last_timestamp=present[-1][0],
        stddev=math.sqrt(math.fsum((v - mean) ** 2 for v in vs) / n),
        changes=sum(1 for a, b in pairs if a != b),
        resets=sum(1 for a, b in pairs if b < a),
        first=vs[0],
    )


class History:
    """Ring buffer of samples of a fixed set of signals. Thread-safe (one writer, many readers)."""

    def __init__(self, signals: Iterable[str], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("history capacity must be at least 1")
        self.signals = tuple(signals)
        self.capacity = capacity
        self._ts = array("d", [NAN]) * capacity
        self._cols = {s: array("d", [NAN]) * capacity for s in self.signals}
        self._next = 0
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def append(self, timestamp: float, values: Mapping[str, float]) -> None:
        with self._lock:
            i = self._next
            self._ts[i] = timestamp
            for signal, col in self._cols.items():
                col[i] = values.get(signal, NAN)
            self._next = (i + 1) % self.capacity
            self._size = min(self._size + 1, self.capacity)

    def window(self, start: float, end: float = math.inf) -> tuple[list[float], dict[str, list[float]]]:
        """Samples with ``start <= t <= end``, oldest first, as columns."""
        with self._lock:
            slots = self._slots(start, end)
            return [self._ts[i] for i in slots], {s: [c[i] for i in slots] for s, c in self._cols.items()}

    def stats(self, start: float, end: float = math.inf) -> dict[str, WindowStats]:
        timestamps, columns = self.window(start, end)
        out: dict[str, WindowStats] = {}
        for signal, values in columns.items():
            s = summarise(timestamps, values)
            if s is not None:
                out[signal] = s
        return out

    def _slots(self, start: float, end: float) -> list[int]:
        slots: list[int] = []
        i = self._next
        for _ in range(self._size):  # newest to oldest; stop at the first sample before the window
            i = (i - 1) % self.capacity
            t = self._ts[i]
            if t < start:
                break
            if t <= end:
                slots.append(i)
        slots.reverse()
        return slots
