"""ECC rule: uncorrectable memory errors on one GPU.

A fault is any of: the volatile double-bit error counter increased within the lookback; the
uncorrectable remapped-rows counter increased within it; a row-remap failure is reported; retired
pages are pending. Counters are judged only on clean windows: a reset, a negative value or a
decrease is garbage (UNKNOWN), never a fault. Row remapping and page retirement are optional
(older and newer GPUs each have only one of them); the DBE counter is required for HEALTHY.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.quarantine.data import (
    MIN_MAX_LAST,
    DataRules,
    counter_increase,
    counter_problem,
    fmt,
    read,
)
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState


@dataclass(frozen=True, slots=True)
class _EccSignal:
    signal: Signal
    key: str  # fingerprint key in the node record
    counter: bool  # True: fault on increase; False: fault while > 0
    required: bool


ECC_SIGNALS: tuple[_EccSignal, ...] = (
    _EccSignal(Signal.ECC_DBE_VOLATILE, "dbe", counter=True, required=True),
    _EccSignal(Signal.REMAPPED_ROWS_UNCORRECTABLE, "remappedRows", counter=True, required=False),
    _EccSignal(Signal.ROW_REMAP_FAILURE, "remapFailure", counter=False, required=False),
    _EccSignal(Signal.RETIRED_PAGES_PENDING, "retiredPending", counter=False, required=False),
)


#: Level gauges (remap failure, pending pages) are queried without a minimum.
LEVEL_FIELDS = ("max", "last")


def _level_problem(stats: Stats) -> str:
    return "negative value" if stats.last < 0 or stats.max < 0 else ""


def judge_ecc(gpu: GPUSample, rules: DataRules) -> GpuJudgement:
    """ECC state of one GPU over the fault lookback window."""
    triggers: list[str] = []
    triggered: list[str] = []
    problems: list[str] = []
    fingerprint: dict[str, float] = {}
    floors: dict[str, float] = {}
    for spec in ECC_SIGNALS:
        fields = MIN_MAX_LAST if spec.counter else LEVEL_FIELDS
        reading = read(gpu, Window.FAULT, spec.signal, rules, fields)
        if reading.stats is None:
            if reading.present or spec.required:
                problems.append(reading.problem)
            continue
        stats = reading.stats
        garbage = counter_problem(stats) if spec.counter else _level_problem(stats)
        if garbage:
            problems.append(f"{spec.signal.name} {garbage}")
            continue
        fingerprint[spec.key] = stats.last
        floors[spec.key] = stats.min if spec.counter else stats.last
        if spec.counter:
            increase = counter_increase(stats)
            if increase > 0:
                triggers.append(f"{spec.key}={fmt(stats.last)} (+{fmt(increase)})")
                triggered.append(spec.key)
        elif stats.last > 0:
            triggers.append(f"{spec.key}={fmt(stats.last)}")
            triggered.append(spec.key)
    if triggers:
        state, reason = GpuState.FAULT, ""
    elif problems:
        state, reason = GpuState.UNKNOWN, "; ".join(problems)
    else:
        state, reason = GpuState.HEALTHY, ""
    return GpuJudgement(
        kind=FaultKind.ECC,
        node=gpu.node,
        uuid=gpu.uuid,
        index=gpu.index,
        state=state,
        summary=", ".join(triggers),
        reason=reason,
        fingerprint=fingerprint,
        floors=floors,
        triggered=tuple(triggered),
    )
