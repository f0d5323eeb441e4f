"""Timed fault injections and what they do to one GPU's readings at time t.

Pure functions of the fault list and t, like the profiles: a fault's effect can be asserted at any
instant, and counters (ECC, remapped rows) are sums of the injections so far, so they never go
backwards unless a ``garbage: counter-reset`` fault says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog


class FaultKind(StrEnum):
    ECC = "ecc"  # double-bit volatile ECC counter += value
    XID = "xid"  # XID gauge = value
    TEMPERATURE = "temperature"  # GPU temperature = value (memory temperature value + 4)
    CLOCK_EVENTS = "clock-events"  # clock-event bits |= value
    GAP = "gap"  # the GPU's series (or one metric's) disappear
    EXPORTER_DOWN = "exporter-down"  # /metrics answers 503, refuses connections, or hangs
    GARBAGE = "garbage"  # NaN, +Inf, negative values or a counter reset
    REMAPPED_ROWS = "remapped-rows"  # uncorrectable remapped rows += value
    ROW_REMAP_FAILURE = "row-remap-failure"  # row-remap failure gauge = 1
    SLOWDOWN = "slowdown"  # SM clock and power x value (0-1): a throttled GPU, a straggler of its job
    PCIE_LINK = "pcie-link"  # the link trains to at most value: "x8", "gen3" or "gen3x8" (down-trained)


class Garbage(StrEnum):
    NAN = "nan"
    INF = "inf"
    NEGATIVE = "negative"
    COUNTER_RESET = "counter-reset"


class ExporterDown(StrEnum):
    HTTP_503 = "503"
    REFUSED = "refused"
    HANG = "hang"


#: What a garbage fault poisons when it names no metric.
GARBAGE_DEFAULT_METRICS: Final[dict[Garbage, tuple[str, ...]]] = {
    Garbage.NAN: catalog.ACTIVITY_METRICS,
    Garbage.INF: catalog.ACTIVITY_METRICS,
    Garbage.NEGATIVE: (str(Signal.ECC_DBE_VOLATILE),),
    Garbage.COUNTER_RESET: tuple(sorted(catalog.COUNTERS)),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One injection. ``node``/``gpu`` None mean every node / every GPU of the node."""

    kind: FaultKind
    at: float
    duration: float | None = None  # None: until the end
    node: str | None = None
    gpu: int | None = None
    value: float | str | None = None
    metric: str | None = None

    def active(self, t: float) -> bool:
        return self.at <= t and (self.duration is None or t < self.at + self.duration)

    def hits(self, node: str, gpu: int) -> bool:
        return (self.node is None or self.node == node) and (self.gpu is None or self.gpu == gpu)

    @property
    def metrics(self) -> tuple[str, ...]:
        if self.metric is not None:
            return (self.metric,)
        if self.kind is FaultKind.GARBAGE:
            return GARBAGE_DEFAULT_METRICS[Garbage(str(self.value))]
        return ()


_LINK = re.compile(r"(?:gen([1-7]))?(?:x(1|2|4|8|12|16|32))?")


def parse_link(value: float | str | None) -> tuple[int | None, int | None]:
    """(generation, width) a pcie-link fault caps the link at: "x8", "gen3", "gen3x8" or a width."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"x{int(value)}" if float(value).is_integer() else str(value)
    match = _LINK.fullmatch(str(value).strip().lower()) if value is not None else None
    if match is None or not any(match.groups()):
        raise ValueError(
            f"pcie-link value must be x<lanes>, gen<N> or gen<N>x<lanes> (e.g. x8), not {value!r}"
        )
    gen, width = match.groups()
    return (int(gen) if gen else None, int(width) if width else None)


def _number(value: float | str | None, default: float) -> float:
    return default if value is None else float(value)


def _counter_base(faults: Sequence[Fault], metric: str, t: float) -> float:
    """Time of the last counter reset of ``metric`` at or before t (-inf if none)."""
    last = -math.inf
    for f in faults:
        if (
            f.kind is FaultKind.GARBAGE
            and f.value == Garbage.COUNTER_RESET
            and f.at <= t
            and metric in f.metrics
            and f.at > last
        ):
            last = f.at
    return last


def last_counter_reset(faults: Iterable[Fault], node: str, gpu: int, metric: str, t: float) -> float:
    """For stateful counters (energy): when ``metric`` of this GPU was last reset (-inf if never)."""
    return _counter_base([f for f in faults if f.hits(node, gpu)], metric, t)


def apply(
    values: dict[str, float], faults: Sequence[Fault], node: str, gpu: int, t: float
) -> dict[str, float] | None:
    """Apply the faults that hit this GPU to ``values`` (in place); None when its series are gone.

    ``faults`` may hold faults of other GPUs; callers pre-filter by node for speed.
    """
    mine = [f for f in faults if f.hits(node, gpu) and f.at <= t]
    if not mine:
        return values
    for metric, kind in (
        (str(Signal.ECC_DBE_VOLATILE), FaultKind.ECC),
        (str(Signal.REMAPPED_ROWS_UNCORRECTABLE), FaultKind.REMAPPED_ROWS),
    ):
        base = _counter_base(mine, metric, t)
        values[metric] = values.get(metric, 0) + sum(
            int(_number(f.value, 1)) for f in mine if f.kind is kind and f.at > base
        )
    for f in mine:
        if not f.active(t):
            continue
        if f.kind is FaultKind.XID:
            values[Signal.XID] = int(_number(f.value, 79))
        elif f.kind is FaultKind.TEMPERATURE:
            temp = _number(f.value, 95)
            values[Signal.GPU_TEMP] = round(temp)
            values[Signal.MEMORY_TEMP] = round(temp + 4)
        elif f.kind is FaultKind.CLOCK_EVENTS:
            bits = int(_number(f.value, catalog.THERMAL_SLOWDOWN_BITS))
            values[catalog.CLOCK_EVENTS_NEW] = int(values.get(catalog.CLOCK_EVENTS_NEW, 0)) | bits
        elif f.kind is FaultKind.SLOWDOWN:
            speed = _number(f.value, 0.6)
            for metric in (catalog.SM_CLOCK, str(Signal.POWER)):
                if metric in values:
                    values[metric] = round(values[metric] * speed, 3)
        elif f.kind is FaultKind.PCIE_LINK:
            gen, width = parse_link(f.value)
            for metric, cap in ((str(Signal.PCIE_LINK_GEN), gen), (str(Signal.PCIE_LINK_WIDTH), width)):
                if cap is not None and metric in values:
                    values[metric] = min(values[metric], cap)
        elif f.kind is FaultKind.ROW_REMAP_FAILURE:
            values[Signal.ROW_REMAP_FAILURE] = 1
        elif f.kind is FaultKind.GAP:
            if f.metric is None:
                return None
            values.pop(f.metric, None)
        elif f.kind is FaultKind.GARBAGE:
            _garbage(values, f)
    return values


def _garbage(values: dict[str, float], fault: Fault) -> None:
    kind = Garbage(str(fault.value))
    for metric in fault.metrics:
        if kind is Garbage.NAN:
            values[metric] = math.nan
        elif kind is Garbage.INF:
            values[metric] = math.inf
        elif kind is Garbage.NEGATIVE:
            values[metric] = -abs(float(values.get(metric, 0))) - 1.0
        # counter resets are handled by the counter sums and the simulator's accumulators


def exporter_down(faults: Iterable[Fault], t: float) -> Fault | None:
    """The exporter-down fault in effect at t, if any."""
    for f in faults:
        if f.kind is FaultKind.EXPORTER_DOWN and f.active(t):
            return f
    return None
