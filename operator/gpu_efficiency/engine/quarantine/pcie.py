"""PCIe link rule: a GPU whose link trained below its maximum width, or generation while busy.

A link narrower than its maximum (x8 of x16) is down-trained whatever the load: the lane count is
fixed at link training, and a bad riser, slot or retimer shows as lost lanes. A generation below the
maximum counts only while the GPU is busy: NVIDIA GPUs lower the link speed with their performance
state when idle to save power (an idle H100 reads Gen1 of Gen5), so an idle GPU's generation says
nothing. Both are judged on the fault window's extremes (``faults.lookback``), never on one reading:

- FAULT when the width never reached its maximum in the window (width max < max width), or the GPU
  was busy in every sample (GPU utilization min >= ``BUSY_UTIL_PERCENT``) and the generation never
  reached its maximum;
- HEALTHY when every width reading was full and there is no busy generation shortfall;
- PENDING otherwise (a link that came and went, a low generation whose load is unknown);
- UNKNOWN on missing, stale, sparse or garbage data: a width or generation outside what PCIe defines
  (0, a width over the maximum, x3), non-integers, NaN, or a maximum that changed in the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.quarantine.data import DataRules, read
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState

#: Link widths the PCIe base specification defines (lanes).
WIDTHS = frozenset({1, 2, 4, 8, 12, 16, 32})
#: PCIe generations defined so far (7.0: 2025).
MAX_GENERATION = 7
#: A GPU computing at least half of every sampling period stays in its performance state (P0/P2),
#: where its link runs at full speed; below that it may have idled long enough to lower it.
BUSY_UTIL_PERCENT = 50.0

LINK_SIGNALS = (
    Signal.PCIE_LINK_WIDTH,
    Signal.PCIE_MAX_LINK_WIDTH,
    Signal.PCIE_LINK_GEN,
    Signal.PCIE_MAX_LINK_GEN,
)


@dataclass(frozen=True, slots=True)
class Link:
    """A link's extremes over a window, validated."""

    width_min: int
    width_max: int
    max_width: int
    gen_max: int
    max_gen: int

    @property
    def narrow(self) -> bool:
        """Fewer lanes than the maximum in every reading of the window."""
        return self.width_max < self.max_width

    @property
    def slow(self) -> bool:
        """A generation below the maximum in every reading of the window."""
        return self.gen_max < self.max_gen

    def describe(self, busy: bool) -> str:
        """'x8 of x16', 'Gen3 of Gen5' (busy only) or both, for messages."""
        parts = []
        if self.slow and busy:
            parts.append(f"Gen{self.gen_max} of Gen{self.max_gen}")
        if self.narrow:
            parts.append(f"x{self.width_max} of x{self.max_width}")
        return ", ".join(parts)


def _integers(stats: Stats) -> tuple[int, int] | None:
    lo, hi = float(stats.min), float(stats.max)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo.is_integer() and hi.is_integer() and lo <= hi):
        return None
    return int(lo), int(hi)


def link_of(window: Mapping[Signal, Stats]) -> Link | str:
    """The link's extremes from a window's four link signals, or why they are unusable."""
    bounds: dict[Signal, tuple[int, int]] = {}
    for signal in LINK_SIGNALS:
        stats = window.get(signal)
        if stats is None:
            return f"{signal.name} missing"
        found = _integers(stats)
        if found is None:
            return f"{signal.name} not an integer range"
        bounds[signal] = found
    (w_lo, w_hi), (mw_lo, mw_hi) = bounds[Signal.PCIE_LINK_WIDTH], bounds[Signal.PCIE_MAX_LINK_WIDTH]
    (g_lo, g_hi), (mg_lo, mg_hi) = bounds[Signal.PCIE_LINK_GEN], bounds[Signal.PCIE_MAX_LINK_GEN]
    if mw_lo != mw_hi or mg_lo != mg_hi:
        return "PCIe maximum link changed in the window"
    if mw_hi not in WIDTHS or w_lo not in WIDTHS or w_hi not in WIDTHS or w_hi > mw_hi:
        return f"PCIe link width x{w_lo}-x{w_hi} of x{mw_hi} not a PCIe width"
    if not (g_lo >= 1 and g_hi <= mg_hi <= MAX_GENERATION):
        return f"PCIe link generation {g_lo}-{g_hi} of {mg_hi} not a PCIe generation"
    return Link(w_lo, w_hi, mw_hi, g_hi, mg_hi)


def downtrained(window: Mapping[Signal, Stats]) -> str:
    """'PCIe link x8 of x16' when a busy GPU's window shows a link below its maximum, else ''.

    For a straggler (busy by definition): both a narrower link and a lower generation slow it.
    """
    link = link_of(window)
    if isinstance(link, str) or not (link.narrow or link.slow):
        return ""
    return f"PCIe link {link.describe(busy=True)}"


def judge_pcie(gpu: GPUSample, rules: DataRules) -> GpuJudgement:
    """PCIe link state of one GPU over the fault window."""
    if Signal.PCIE_LINK_WIDTH not in gpu.stats.get(Window.FAULT, {}):  # most GPUs: not fetched, cheap out
        return _judgement(gpu, GpuState.UNKNOWN, reason="PCIE_LINK_WIDTH missing")
    window: dict[Signal, Stats] = {}
    problems = []
    for signal in LINK_SIGNALS:
        reading = read(gpu, Window.FAULT, signal, rules)
        if reading.stats is None:
            problems.append(reading.problem)
        else:
            window[signal] = reading.stats
    link = link_of(window) if not problems else "; ".join(problems)
    if isinstance(link, str):
        return _judgement(gpu, GpuState.UNKNOWN, reason=link)
    util = read(gpu, Window.FAULT, Signal.GPU_UTIL, rules, fields=("min",))
    busy = util.stats is not None and util.stats.min >= BUSY_UTIL_PERCENT
    if link.narrow or (busy and link.slow):
        fingerprint = {"width": float(link.width_max), "gen": float(link.gen_max)}
        return _judgement(gpu, GpuState.FAULT, summary=f"link {link.describe(busy)}", fingerprint=fingerprint)
    if link.width_min < link.max_width:
        return _judgement(
            gpu, GpuState.PENDING, reason=f"link x{link.width_min} of x{link.max_width} at times"
        )
    if link.slow and util.stats is None:
        return _judgement(
            gpu, GpuState.PENDING, reason=f"link Gen{link.gen_max} of Gen{link.max_gen}, load unknown"
        )
    return _judgement(gpu, GpuState.HEALTHY)


def _judgement(
    gpu: GPUSample,
    state: GpuState,
    *,
    summary: str = "",
    reason: str = "",
    fingerprint: Mapping[str, float] | None = None,
) -> GpuJudgement:
    found = dict(fingerprint or {})
    return GpuJudgement(
        kind=FaultKind.PCIE,
        node=gpu.node,
        uuid=gpu.uuid,
        index=gpu.index,
        state=state,
        summary=summary,
        reason=reason,
        fingerprint=found,
        triggered=tuple(found),
    )
