"""Diagnosis of a GPU that is busy on paper but does little work (the diagnosis table in docs/what-you-see.md).

Inputs are activity-window averages (peaks decide idleness elsewhere). When several findings apply,
the first in ``PRECEDENCE`` wins, on this reasoning:

1. thermal-throttling: a hardware cause slows everything; no code change helps until it is fixed.
2. memory-pressure: an imminent out-of-memory kill is the most urgent thing to tell the user.
3. With SM activity below ``lowActivityBelow``, the measured bottleneck before the symptom:
   communication-bound (NCCL traffic also drives DRAM and keeps GPU_UTIL high), memory-bound
   (bandwidth-bound kernels also read as fake load), input-starved, then fake-load (GPU_UTIL high,
   no explanation), then low-compute (no signal says why).
4. no-tensor-cores (SM 0.3-0.7, tensor pipe idle): mixed precision is the larger win ...
5. ... over low-occupancy (SM busy, warps few: raise the batch size).
6. compute-bound (SM activity at or above ``efficientSmActiveAbove``): the good case, left alone.
7. otherwise low-compute: moderate activity with no finding.

A diagnosis that needs a signal the exporter does not serve (tensor, occupancy, DRAM, NVLink) is
simply not made: missing data never produces a finding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.engine.model import Diagnosis, Signal, Stats, Verdict
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.activity import UNBOUNDED, DataBounds, GPUActivity, usable

PRECEDENCE: tuple[Diagnosis, ...] = (
    Diagnosis.THERMAL_THROTTLING,
    Diagnosis.MEMORY_PRESSURE,
    Diagnosis.COMMUNICATION_BOUND,
    Diagnosis.MEMORY_BOUND,
    Diagnosis.INPUT_STARVED,
    Diagnosis.FAKE_LOAD,
    Diagnosis.NO_TENSOR_CORES,
    Diagnosis.LOW_OCCUPANCY,
    Diagnosis.LOW_COMPUTE,
    Diagnosis.COMPUTE_BOUND,
)
#: Lower is more important; a multi-GPU pod reports its most important GPU finding.
RANK: Mapping[Diagnosis, int] = {d: i for i, d in enumerate(PRECEDENCE)}

RECOMMENDATIONS: Mapping[Diagnosis, str] = {
    # Stopping a Jupyter kernel frees GPU memory, not the nvidia.com/gpu the pod holds: only the
    # server (or the workload) going away gives the GPU back.
    Diagnosis.IDLE: "give the GPU back while you do not use it: stop the notebook server (stopping "
    "only the kernel keeps the GPU allocated) or scale the workload to 0",
    # A hardware cause: the researcher's code is not at fault and the admins are the ones to act.
    Diagnosis.THERMAL_THROTTLING: "nothing to fix in your code: the node's GPU is slowed by heat (a "
    "cooling or hardware problem for the cluster admins); for full speed now, run on another node",
    Diagnosis.MEMORY_PRESSURE: "reduce the batch size or enable activation checkpointing / "
    "memory-efficient attention before the GPU runs out of memory",
    Diagnosis.COMMUNICATION_BOUND: "overlap communication with compute, check NVLink/NCCL topology, "
    "use larger gradient buckets",
    Diagnosis.MEMORY_BOUND: "fuse kernels / use FlashAttention / raise arithmetic intensity",
    Diagnosis.INPUT_STARVED: "raise DataLoader num_workers, enable pin_memory and prefetching; "
    "check storage throughput",
    Diagnosis.FAKE_LOAD: "the GPU runs tiny kernels continuously: check for busy-wait polling or a tiny "
    "model; consider a smaller GPU/MIG slice",
    Diagnosis.NO_TENSOR_CORES: "enable mixed precision (bf16/fp16 autocast) or TF32",
    Diagnosis.LOW_OCCUPANCY: "raise the batch size (or use larger fused kernels / CUDA graphs)",
    Diagnosis.LOW_COMPUTE: "profile with Nsight Systems to find the stall, or use a smaller GPU/MIG slice",
    Diagnosis.COMPUTE_BOUND: "none: the GPU is used well",
    # Shown on the researcher's pod: the exporter set-up is the admins' task (explain and the
    # policy's status tell them).
    Diagnosis.INSUFFICIENT_DATA: "nothing to do: there are no usable GPU metrics for this pod yet, "
    "and nothing happens to it until there are",
}

#: Clock-event reason bits that mean thermal slowdown (SW thermal 0x20, HW thermal 0x40).
THERMAL_CLOCK_EVENT_BITS = 0x20 | 0x40
_FRACTION = 1.0 + 1e-6
_PERCENT = 100.0 + 1e-4


@dataclass(frozen=True, slots=True)
class Finding:
    """One GPU's diagnosis with its evidence."""

    diagnosis: Diagnosis
    evidence: str  # the numbers and thresholds that triggered it
    recommendation: str
    gpu_util: float | None  # 0-1 average, when known
    efficiency: float | None  # activity / GPU util x 100, when both known and distinct

    @property
    def rank(self) -> int:
        return RANK.get(self.diagnosis, len(PRECEDENCE))


def verdict_of(diagnosis: Diagnosis, activity_avg: float, params: CycleParams) -> Verdict:
    """Compute-bound is Efficient, and so is memory pressure on an otherwise busy GPU."""
    if diagnosis is Diagnosis.COMPUTE_BOUND:
        return Verdict.EFFICIENT
    if diagnosis is Diagnosis.MEMORY_PRESSURE and activity_avg >= params.under.efficient_sm_active_above:
        return Verdict.EFFICIENT
    return Verdict.UNDERUTILIZED


def time_to_oom(fb_used: Stats, total_mib: float, window_s: float) -> float | None:
    """Seconds until framebuffer use reaches the total at the window's trend, or None if not rising.

    For a linear ramp the window average sits halfway between the oldest and newest values, so the
    slope is 2 x (last - avg) / window. That estimate is deliberately damped: a one-off model load at
    the start of the window moves the average little, so it does not predict a false OOM.
    """
    last = fb_used.last if math.isfinite(fb_used.last) else fb_used.max
    if window_s <= 0 or not math.isfinite(last) or last < fb_used.max:  # newest is not the peak
        return None
    slope = 2.0 * (last - fb_used.avg) / window_s
    if slope <= 0:
        return None
    return max(0.0, (total_mib - last) / slope)


def _memory_pressure(
    window: Mapping[Signal, Stats], bounds: DataBounds, fb_total_mib: float | None, params: CycleParams
) -> str:
    """Evidence of memory pressure ('' when none): use at or over the limit, or OOM within a window."""
    used = usable(window.get(Signal.FB_USED), UNBOUNDED, bounds)
    if used is None:
        return ""
    last = used.last if math.isfinite(used.last) else used.max
    total = fb_total_mib
    if not total:
        free = usable(window.get(Signal.FB_FREE), UNBOUNDED, bounds)
        if free is None or not math.isfinite(free.last):
            return ""
        total = last + free.last
    if total <= 0:
        return ""
    fraction = last / total
    ttoom = time_to_oom(used, total, params.window_s)
    limit = params.under.memory_pressure_fraction
    if fraction < limit and (ttoom is None or ttoom > params.window_s):
        return ""
    trend = f", out of memory in ~{format_duration(ttoom)} at the current trend" if ttoom is not None else ""
    return f"framebuffer {last:.0f}/{total:.0f} MiB ({fraction:.0%}, limit {limit:.0%}){trend}"


def _thermal(window: Mapping[Signal, Stats], bounds: DataBounds, params: CycleParams) -> str:
    events = usable(window.get(Signal.CLOCK_EVENTS), UNBOUNDED, bounds)
    if events is not None:
        bits = 0
        for value in (events.last, events.max):
            if math.isfinite(value):
                bits |= int(value)
        if bits & THERMAL_CLOCK_EVENT_BITS:
            return f"thermal slowdown clock-event bits set (0x{bits:x})"
    temp = usable(window.get(Signal.GPU_TEMP), UNBOUNDED, bounds)
    limit = params.under.temperature_limit_celsius
    if temp is not None and temp.avg > limit:
        return f"average GPU temperature {temp.avg:.0f} C above {limit:.0f} C"
    return ""


def efficiency_percent(activity: float, util: float | None) -> float | None:
    """Activity per unit of GPU util, in percent: how much of the time a kernel ran was real work.
    None when util is unknown or too small for the ratio to mean anything."""
    if util is None or util < 0.01:
        return None
    return min(100.0, activity / util * 100.0)


def diagnose(
    window: Mapping[Signal, Stats],
    activity: GPUActivity,
    params: CycleParams,
    bounds: DataBounds,
    fb_total_mib: float | None = None,
) -> Finding:
    """The diagnosis of one GPU with known activity (see the module docstring for the precedence)."""
    rule = params.under
    sm = activity.avg
    signal = activity.signal
    name = "SM activity" if signal is Signal.SM_ACTIVE else f"activity ({signal.value if signal else '?'})"
    util_stats = usable(window.get(Signal.GPU_UTIL), _PERCENT, bounds)
    util = util_stats.avg / 100.0 if util_stats is not None else None
    efficiency = efficiency_percent(sm, util) if signal is not Signal.GPU_UTIL else None

    def found(diagnosis: Diagnosis, evidence: str, recommendation: str = "") -> Finding:
        return Finding(diagnosis, evidence, recommendation or RECOMMENDATIONS[diagnosis], util, efficiency)

    thermal = _thermal(window, bounds, params)
    if thermal:
        return found(Diagnosis.THERMAL_THROTTLING, thermal)
    pressure = _memory_pressure(window, bounds, fb_total_mib, params)
    if pressure:
        return found(Diagnosis.MEMORY_PRESSURE, pressure)

    low = rule.low_activity_below
    if sm < low:
        nvlink = 0.0
        for link in (Signal.NVLINK_RX_BYTES, Signal.NVLINK_TX_BYTES):
            stats = usable(window.get(link), UNBOUNDED, bounds)
            if stats is not None:
                nvlink += stats.avg
        if nvlink > rule.communication_bytes_per_second:
            return found(
                Diagnosis.COMMUNICATION_BOUND,
                f"{name} {sm:.3f} < {low} while NVLink traffic averages {nvlink / 1e9:.1f} GB/s "
                f"(> {rule.communication_bytes_per_second / 1e9:.1f} GB/s)",
            )
        dram = usable(window.get(Signal.DRAM_ACTIVE), _FRACTION, bounds)
        if dram is not None and dram.avg > rule.memory_bound_dram_above:
            return found(
                Diagnosis.MEMORY_BOUND,
                f"{name} {sm:.3f} < {low} while DRAM activity is {dram.avg:.3f} "
                f"(> {rule.memory_bound_dram_above})",
            )
        starved = _input_starved(window, bounds, params, util_stats)
        if starved:
            return found(Diagnosis.INPUT_STARVED, f"{name} {sm:.3f} < {low} with {starved}")
        if util is not None and signal is not Signal.GPU_UTIL and util >= rule.fake_load_gpu_util_above:
            return found(
                Diagnosis.FAKE_LOAD,
                f"GPU_UTIL {util:.3f} >= {rule.fake_load_gpu_util_above} while {name} is {sm:.3f} < {low}",
            )
        return found(Diagnosis.LOW_COMPUTE, f"{name} {sm:.3f} < {low} and no signal explains why")

    if rule.no_tensor_sm_active_min <= sm <= rule.no_tensor_sm_active_max:
        tensor = usable(window.get(Signal.TENSOR_ACTIVE), _FRACTION, bounds)
        if tensor is not None and tensor.avg < rule.no_tensor_tensor_below:
            return found(
                Diagnosis.NO_TENSOR_CORES,
                f"{name} {sm:.3f} in [{rule.no_tensor_sm_active_min}, {rule.no_tensor_sm_active_max}] "
                f"with tensor pipe activity {tensor.avg:.3f} < {rule.no_tensor_tensor_below}",
            )
    if sm > rule.low_occupancy_sm_active_above:
        occupancy = usable(window.get(Signal.SM_OCCUPANCY), _FRACTION, bounds)
        if occupancy is not None and occupancy.avg < rule.low_occupancy_below:
            return found(
                Diagnosis.LOW_OCCUPANCY,
                f"{name} {sm:.3f} > {rule.low_occupancy_sm_active_above} with SM occupancy "
                f"{occupancy.avg:.3f} < {rule.low_occupancy_below}",
            )
    if sm >= rule.efficient_sm_active_above:
        return found(Diagnosis.COMPUTE_BOUND, f"{name} {sm:.3f} >= {rule.efficient_sm_active_above}")
    return found(
        Diagnosis.LOW_COMPUTE,
        f"{name} {sm:.3f} between {low} and {rule.efficient_sm_active_above} with no specific bottleneck",
    )


def _input_starved(
    window: Mapping[Signal, Stats], bounds: DataBounds, params: CycleParams, util_stats: Stats | None
) -> str:
    """PCIe RX bursts plus oscillating utilisation or a power sawtooth: the loader cannot keep up."""
    rule = params.under
    rx = usable(window.get(Signal.PCIE_RX_BYTES), UNBOUNDED, bounds)
    if rx is None or rx.max <= rule.input_starved_pcie_rx_bytes_per_second:
        return ""
    burst = f"PCIe RX bursts to {rx.max / 1e9:.1f} GB/s"
    limit = rule.oscillation_stddev_above
    if util_stats is not None and math.isfinite(util_stats.stddev) and util_stats.stddev / 100.0 > limit:
        return f"{burst} and GPU_UTIL oscillating (stddev {util_stats.stddev / 100.0:.2f} > {limit})"
    power = usable(window.get(Signal.POWER), UNBOUNDED, bounds)
    if (
        power is not None
        and power.avg > 0
        and math.isfinite(power.stddev)
        and power.stddev / power.avg > limit
    ):
        return f"{burst} and a power sawtooth (relative stddev {power.stddev / power.avg:.2f} > {limit})"
    return ""
