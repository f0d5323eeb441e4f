"""Data sufficiency for fault rules: a signal counts only when present, finite, fresh and dense enough.

Safety rule 1: absence of data is never health and never a fault. Every rule reads its signals
through ``read`` and turns any problem into the GPU state UNKNOWN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.params import CycleParams


@dataclass(frozen=True, slots=True)
class DataRules:
    """What "enough data" means this cycle, from the policy's metrics settings."""

    now: float
    scrape_interval_s: float
    min_coverage: float
    max_staleness_s: float
    window_s: Mapping[Window, float]

    def expected(self, gpu: GPUSample, window: Window) -> float:
        """Samples a full window holds: the source's figure if it gave one, else window / scrape."""
        given = gpu.expected_samples.get(window)
        if given is not None and math.isfinite(given) and given > 0:
            return given
        if self.scrape_interval_s <= 0:
            return 1.0
        return max(1.0, self.window_s.get(window, 0.0) / self.scrape_interval_s)


def data_rules(params: CycleParams, now: float) -> DataRules:
    """The cycle's parameters as the fault rules read them."""
    return DataRules(
        now=now,
        scrape_interval_s=params.scrape_interval_s,
        min_coverage=params.min_coverage,
        max_staleness_s=params.max_staleness_s,
        window_s=params.fault_windows_s or {},
    )


@dataclass(frozen=True, slots=True)
class Reading:
    """A signal's stats when usable; otherwise why not. ``present`` separates absent from bad."""

    stats: Stats | None
    problem: str = ""
    present: bool = True

    @property
    def ok(self) -> bool:
        return self.stats is not None


def _finite(*values: float | None) -> bool:
    return all(v is None or math.isfinite(v) for v in values)


#: The aggregates most rules read; a rule names fewer when its source does not query the rest.
MIN_MAX_LAST = ("min", "max", "last")


def check_values(stats: Stats, fields: tuple[str, ...] = MIN_MAX_LAST) -> str:
    """Why the values a rule reads are unusable (NaN, infinite), or ''."""
    if stats.count < 1:
        return "no samples"
    if not _finite(stats.first, *(float(getattr(stats, name)) for name in fields)):
        return "non-finite values"
    return ""


def check_freshness(stats: Stats, rules: DataRules) -> str:
    """Why the newest sample is too old (or has no usable time), or ''."""
    ts = stats.last_timestamp
    if not math.isfinite(ts):
        return "no sample timestamp"
    age = rules.now - ts
    if age > rules.max_staleness_s:
        return f"stale: newest sample {age:.0f}s old"
    return ""


def check_coverage(stats: Stats, expected: float, rules: DataRules) -> str:
    """Why the window holds too few samples, or ''."""
    if stats.count < rules.min_coverage * expected:
        return f"too sparse: {stats.count} of ~{expected:.0f} samples"
    return ""


def read(
    gpu: GPUSample,
    window: Window,
    signal: Signal,
    rules: DataRules,
    fields: tuple[str, ...] = MIN_MAX_LAST,
) -> Reading:
    """The stats of ``signal`` over ``window`` if present, finite, fresh and dense enough."""
    stats = gpu.get(window, signal)
    if stats is None:
        return Reading(None, f"{signal.name} missing", present=False)
    problem = (
        check_values(stats, fields)
        or check_freshness(stats, rules)
        or check_coverage(stats, rules.expected(gpu, window), rules)
    )
    if problem:
        return Reading(None, f"{signal.name} {problem}")
    return Reading(stats)


def counter_problem(stats: Stats) -> str:
    """Why a monotonic counter's window is garbage (reset, negative, decreasing), or ''."""
    if stats.resets > 0:
        return "counter reset in the window"
    if stats.min < 0 or stats.last < 0:
        return "negative counter"
    if stats.first is not None and stats.last < stats.first:
        return "counter decreased"
    if stats.max < stats.min or stats.last > stats.max or stats.last < stats.min:
        return "inconsistent min/max/last"
    return ""


def counter_increase(stats: Stats) -> float:
    """Increase over the window of a clean counter: last minus the oldest value (min when not given)."""
    start = stats.first if stats.first is not None else stats.min
    return max(0.0, stats.last - start)


def fmt(value: float) -> str:
    """A value for messages: integers without decimals, others with one."""
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
