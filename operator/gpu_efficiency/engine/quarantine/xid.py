"""XID rule: a critical driver error on one GPU.

dcgm-exporter's XID gauge holds the *last* XID and keeps it, so a value alone is history, not a
fault. A fault is a critical, not ignored, current value that is new within the lookback window:

- the gauge changed in the window (``changes > 0``), or
- the series appeared in the window: it is fresh but holds fewer than half the samples of the
  GPU's other fault signals over the same window (which themselves have full coverage). A scrape
  gap hits every series of a target alike, so only a new series is thin while its siblings are not.

Anything else with clean data is HEALTHY (nothing new happened), which is what lets the same value
staying in the gauge never re-trigger. Limits: the gauge shows only the last XID, so a critical XID
followed by an ignored one inside one scrape is invisible, and a repeat of the same code leaves it
unchanged; the node agent reports events instead.

Where the exporter serves ``DCGM_EXP_XID_ERRORS_COUNT`` (``GPUSample.xid_events``, dcgm-exporter
4.8.3+ or any CSV that enables it), the events counted within the lookback decide instead: every
code that arrived is seen, however many came between two scrapes.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.quarantine.data import (
    DataRules,
    check_coverage,
    check_freshness,
    check_values,
    read,
)
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState

#: A new series holds fewer than this share of its full-coverage siblings' samples.
APPEARED_BELOW = 0.5


def _reference_count(gpu: GPUSample, rules: DataRules) -> int:
    """Samples of the GPU's best-covered other fault signal, or 0 when none is fresh and dense."""
    best = 0
    for signal, stats in gpu.stats.get(Window.FAULT, {}).items():
        if signal is Signal.XID:
            continue
        expected = rules.expected(gpu, Window.FAULT)
        if not check_freshness(stats, rules) and not check_coverage(stats, expected, rules):
            best = max(best, stats.count)
    return best


def _appeared(gpu: GPUSample, stats: Stats, rules: DataRules) -> bool:
    reference = _reference_count(gpu, rules)
    return reference > 0 and stats.count < APPEARED_BELOW * reference


def _read_xid(gpu: GPUSample, rules: DataRules) -> tuple[int, bool] | str:
    """(code, new within the window) from clean data, else why the XID cannot be read."""
    stats = gpu.get(Window.FAULT, Signal.XID)
    if stats is None:
        return "XID missing"
    problem = check_values(stats) or check_freshness(stats, rules)
    if not problem and (stats.last < 0 or not float(stats.last).is_integer()):
        problem = f"not an XID code: {stats.last}"
    if problem:
        return f"XID {problem}"
    if read(gpu, Window.FAULT, Signal.XID, rules).ok:
        new = stats.changes > 0
    elif _appeared(gpu, stats, rules):
        new = True
    else:
        expected = rules.expected(gpu, Window.FAULT)
        return f"XID {check_coverage(stats, expected, rules)}"
    return int(stats.last), new


def counted(gpu: GPUSample, rules: DataRules) -> dict[int, int] | None:
    """XID events per code within the fault lookback, where the exporter counts them (else None)."""
    if gpu.xid_events is None:
        return None
    within = gpu.xid_events.get(max(1, round(rules.window_s.get(Window.FAULT, 0.0))), {})
    return {code: n for code, n in within.items() if n > 0}


def new_xids(gpu: GPUSample, rules: DataRules) -> list[int]:
    """Every XID code the GPU newly reported within the window: all counted codes where the exporter
    counts them, else the gauge's new code (``new_xid``)."""
    events = counted(gpu, rules)
    if events is not None:
        return sorted(code for code in events if code != 0)
    code = new_xid(gpu, rules)
    return [] if code is None else [code]


def new_xid(gpu: GPUSample, rules: DataRules) -> int | None:
    """The XID code the GPU newly reported within the window (any code, tainting or not), else None."""
    read_ = _read_xid(gpu, rules)
    if isinstance(read_, str) or not read_[1] or read_[0] == 0:
        return None
    return read_[0]


def judge_xid(gpu: GPUSample, rules: DataRules, *, taints: Callable[[int], bool]) -> GpuJudgement:
    """XID state of one GPU over the fault lookback window; ``taints`` says which codes are faults."""

    def judged(
        state: GpuState, summary: str = "", reason: str = "", xid: float | None = None
    ) -> GpuJudgement:
        fingerprint = {} if xid is None else {"xid": xid}
        return GpuJudgement(
            kind=FaultKind.XID,
            node=gpu.node,
            uuid=gpu.uuid,
            index=gpu.index,
            state=state,
            summary=summary,
            reason=reason,
            fingerprint=fingerprint,
            triggered=("xid",) if state is GpuState.FAULT else (),
        )

    events = counted(gpu, rules)
    if events is not None:
        tainting = sorted(((n, -code) for code, n in events.items() if code and taints(code)), reverse=True)
        if tainting:
            n, code = tainting[0][0], -tainting[0][1]
            return judged(GpuState.FAULT, summary=f"xid={code} x{n} counted", xid=float(code))
        seen = ", ".join(f"{code} x{n}" for code, n in sorted(events.items()))
        return judged(GpuState.HEALTHY, summary=f"xids counted: {seen or 'none'}")
    read_ = _read_xid(gpu, rules)
    if isinstance(read_, str):
        return judged(GpuState.UNKNOWN, reason=read_)
    xid, new = read_
    summary = f"xid={xid}"
    if new and taints(xid):
        return judged(GpuState.FAULT, summary=summary, xid=float(xid))
    return judged(GpuState.HEALTHY, summary=summary, xid=float(xid))
