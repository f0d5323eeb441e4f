"""Thermal rule: a GPU too hot for too long, or throttled by thermal slowdown.

FAULT when, over the whole hold window (``forDuration``) with full coverage: the GPU temperature's
minimum is above its limit, or the memory temperature's minimum is above its limit, or every
sample had a thermal slowdown clock-event bit (HW_SLOWDOWN 0x8, SW_THERMAL 0x20, HW_THERMAL 0x40).
Only min/max/last of the bitmask are known, so "every sample" is proven from the bounds: every
integer between min and max must carry a thermal bit (``all_in_range_have``). That never claims a
fault the samples could contradict; a mask that flips between hot and cool values is not proven.

HEALTHY (recovery) when the hold window is clean and cool, and over the whole recovery window the
GPU temperature's maximum is at or below its limit, the memory temperature's too (when the GPU
reports one), and no integer between the bitmask's min and max carries a thermal bit. Otherwise
PENDING (clean but undecided) or UNKNOWN (missing, stale, sparse or garbage data).
"""

from __future__ import annotations

from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.policy import ThermalFault
from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.quarantine.data import DataRules, Reading, fmt, read
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState

HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
THERMAL_BITS = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL


def _next_without(value: int, mask: int) -> int:
    """Smallest integer >= value sharing no bit with ``mask``.

    While value has a mask bit, every integer up to the next multiple of that bit's double keeps it,
    so jump past them: clearing the lowest such bit by carrying upward.
    """
    while value & mask:
        low = value & mask & -(value & mask)
        value = (value | (low - 1)) + 1
    return value


def _next_with(value: int, mask: int) -> int:
    """Smallest integer >= value sharing a bit with ``mask`` (mask must be non-zero)."""
    best = -1
    bit = 1
    while bit <= mask:
        if mask & bit:
            candidate = value if value & bit else (value & ~(2 * bit - 1)) | bit
            best = candidate if best < 0 else min(best, candidate)
        bit <<= 1
    return best


def all_in_range_have(low: int, high: int, mask: int) -> bool:
    """Every integer in [low, high] has a bit of ``mask``."""
    return _next_without(low, mask) > high


def none_in_range_have(low: int, high: int, mask: int) -> bool:
    """No integer in [low, high] has a bit of ``mask``."""
    return _next_with(low, mask) > high


def _bitmask_bounds(stats: Stats) -> tuple[int, int] | None:
    """(min, max) of a bitmask window, or None when they are not non-negative integers."""
    lo, hi = float(stats.min), float(stats.max)
    if lo < 0 or hi < lo or not lo.is_integer() or not hi.is_integer():
        return None
    return int(lo), int(hi)


class _Collector:
    """Accumulates one GPU's thermal evidence, problems and fingerprint."""

    def __init__(self) -> None:
        self.over: list[str] = []
        self.problems: list[str] = []
        self.pending: list[str] = []
        self.fingerprint: dict[str, float] = {}


def _hold(gpu: GPUSample, rules: DataRules, limits: ThermalFault, out: _Collector) -> None:
    """Collect what proves a fault over the hold window."""
    hold = format_duration(rules.window_s.get(Window.THERMAL_HOLD, 0.0))
    for signal, limit, key, label in (
        (Signal.GPU_TEMP, limits.gpu_temperature_above, "gpuTemp", "temperature"),
        (Signal.MEMORY_TEMP, limits.memory_temperature_above, "memoryTemp", "memory temperature"),
    ):
        reading = read(gpu, Window.THERMAL_HOLD, signal, rules)
        if reading.stats is None:
            if reading.present:
                out.problems.append(reading.problem)
            continue
        if reading.stats.min > limit:
            out.over.append(f"{label} above {fmt(limit)}C for {hold} (min {fmt(reading.stats.min)}C)")
            out.fingerprint[key] = reading.stats.max
        elif reading.stats.max > limit:
            out.pending.append(f"{label} above {fmt(limit)}C for part of the hold window")
    if limits.slowdown_clock_events:
        reading = read(gpu, Window.THERMAL_HOLD, Signal.CLOCK_EVENTS, rules)
        bounds = _bounds_or_problem(reading, out)
        if bounds is not None:
            if all_in_range_have(*bounds, THERMAL_BITS):
                out.over.append(f"thermal slowdown clock events for {hold} (mask {bounds[1]:#x})")
                out.fingerprint["clockEvents"] = float(bounds[1])
            elif not none_in_range_have(*bounds, THERMAL_BITS):
                out.pending.append("thermal slowdown in part of the hold window")


def _bounds_or_problem(reading: Reading, out: _Collector) -> tuple[int, int] | None:
    if reading.stats is None:
        if reading.present:
            out.problems.append(reading.problem)
        return None
    bounds = _bitmask_bounds(reading.stats)
    if bounds is None:
        out.problems.append("CLOCK_EVENTS not a bitmask")
    return bounds


def _recovery(gpu: GPUSample, rules: DataRules, limits: ThermalFault) -> tuple[GpuState, str]:
    """HEALTHY when every reading of the recovery window is healthy; else PENDING or UNKNOWN, and why."""
    for signal, limit, required in (
        (Signal.GPU_TEMP, limits.gpu_temperature_above, True),
        (Signal.MEMORY_TEMP, limits.memory_temperature_above, False),
    ):
        reading = read(gpu, Window.THERMAL_RECOVERY, signal, rules)
        if reading.stats is None:
            if reading.present or required:
                return GpuState.UNKNOWN, f"recovery window: {reading.problem}"
            continue
        if reading.stats.max > limit:
            return GpuState.PENDING, f"{signal.name} reached {fmt(reading.stats.max)}C in the recovery window"
    if limits.slowdown_clock_events:
        reading = read(gpu, Window.THERMAL_RECOVERY, Signal.CLOCK_EVENTS, rules)
        if reading.stats is None:
            if reading.present:
                return GpuState.UNKNOWN, f"recovery window: {reading.problem}"
        else:
            bounds = _bitmask_bounds(reading.stats)
            if bounds is None:
                return GpuState.UNKNOWN, "recovery window: CLOCK_EVENTS not a bitmask"
            if not none_in_range_have(*bounds, THERMAL_BITS):
                return GpuState.PENDING, "thermal slowdown bits in the recovery window"
    return GpuState.HEALTHY, ""


def judge_thermal(gpu: GPUSample, rules: DataRules, limits: ThermalFault) -> GpuJudgement:
    """Thermal state of one GPU: hold window for faults, recovery window for health."""
    out = _Collector()
    _hold(gpu, rules, limits, out)
    if out.over:
        state, reason = GpuState.FAULT, ""
    elif out.problems:
        state, reason = GpuState.UNKNOWN, "; ".join(out.problems)
    elif out.pending:
        state, reason = GpuState.PENDING, "; ".join(out.pending)
    else:
        state, reason = _recovery(gpu, rules, limits)
    return GpuJudgement(
        kind=FaultKind.THERMAL,
        node=gpu.node,
        uuid=gpu.uuid,
        index=gpu.index,
        state=state,
        summary="; ".join(out.over),
        reason=reason,
        fingerprint=out.fingerprint,
        triggered=tuple(out.fingerprint),
    )
