"""Workload profiles: what a kind of job does to a GPU, as a pure function of time and a per-GPU seed.

A profile returns an ``Activity`` (the engine-level ratios and the traffic); ``readings`` turns it
into dcgm-exporter values with the physics that follows (power from activity, temperature from the
sustained load, SM clocks, clock-event bits), so every profile stays consistent across signals.
Shapes follow what practitioners see on real dashboards: an input-starved trainer alternates PCIe
bursts, short compute phases and stalls (power sawtooth, oscillating GPU_UTIL); a bursty inference
server shows short SM bursts between idle gaps shorter than an evaluation window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.catalog import ClockEvent
from gpu_efficiency_sim.gpu_models import GPUModel
from gpu_efficiency_sim.noise import jitter, uniform


@dataclass(frozen=True, slots=True)
class Activity:
    """One instant of a workload, in the units of the PROF fields (ratios 0-1, bytes/s)."""

    sm_active: float = 0.0
    sm_occupancy: float = 0.0
    tensor_active: float = 0.0
    dram_active: float = 0.0
    gr_engine_active: float = 0.0
    gpu_util: float = 0.0  # 0-1; rendered in percent
    pcie_rx: float = 0.0
    pcie_tx: float = 0.0
    nvlink_rx: float = 0.0
    nvlink_tx: float = 0.0
    fb_used_fraction: float = 0.0  # of the usable framebuffer (total - reserved)
    heat: float = 0.0  # sustained thermal load 0-1: temperature follows it, not the instantaneous power
    power_load: float | None = None  # instantaneous power as a share of (max - idle); None: from activity
    temp_offset_c: float = 0.0
    sm_clock_fraction: float = 1.0  # of the maximum boost clock while busy
    clock_events: int = 0


ProfileFn = Callable[[float, int, GPUModel], Activity]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    fn: ProfileFn


def _clip(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x


def _phase(t: float, seed: int, period: float) -> float:
    """Position 0-1 in a cycle of this period, with a per-GPU offset so GPUs do not beat in step."""
    return ((t + uniform(seed, 0, 90) * period) / period) % 1.0


def _background_pcie(seed: int, step: int) -> tuple[float, float]:
    """Driver housekeeping traffic of a GPU nobody uses: tens to hundreds of kB/s."""
    return 40e3 + 160e3 * uniform(seed, step, 20), 30e3 + 90e3 * uniform(seed, step, 21)


def idle(t: float, seed: int, model: GPUModel) -> Activity:
    """No work: activity 0, ~idle power, framebuffer empty."""
    step = int(t)
    rx, tx = _background_pcie(seed, step)
    return Activity(pcie_rx=rx, pcie_tx=tx)


def idle_holding_memory(t: float, seed: int, model: GPUModel) -> Activity:
    """A notebook or crashed trainer that keeps its CUDA context and tensors: memory held, no work."""
    step = int(t)
    rx, tx = _background_pcie(seed, step)
    fb = 0.55 + 0.35 * uniform(seed, 0, 30)
    return Activity(pcie_rx=rx, pcie_tx=tx, fb_used_fraction=fb, heat=0.02)


def compute_bound(t: float, seed: int, model: GPUModel) -> Activity:
    """Healthy training: SM ~0.9, tensor cores busy, power near the limit."""
    s = int(t)
    sm = _clip(0.9 + 0.04 * jitter(seed, s, 1))
    nvlink = model.nvlink_bytes_per_s * (0.02 + 0.02 * uniform(seed, s, 7))
    return Activity(
        sm_active=sm,
        sm_occupancy=_clip(0.5 + 0.05 * jitter(seed, s, 2)),
        tensor_active=_clip(0.62 + 0.06 * jitter(seed, s, 3)),
        dram_active=_clip(0.48 + 0.05 * jitter(seed, s, 4)),
        gr_engine_active=_clip(sm + 0.06),
        gpu_util=1.0 if uniform(seed, s, 5) > 0.1 else 0.98,
        pcie_rx=model.pcie_bytes_per_s * (0.02 + 0.04 * uniform(seed, s, 6)),
        pcie_tx=model.pcie_bytes_per_s * 0.005,
        nvlink_rx=nvlink,
        nvlink_tx=nvlink,
        fb_used_fraction=0.86 + 0.04 * uniform(seed, 0, 30),
        heat=0.8,
    )


def memory_bound(t: float, seed: int, model: GPUModel) -> Activity:
    """HBM saturated (DRAM ~0.9) while SM activity stays low (~0.22)."""
    s = int(t)
    return Activity(
        sm_active=_clip(0.22 + 0.03 * jitter(seed, s, 1)),
        sm_occupancy=_clip(0.25 + 0.03 * jitter(seed, s, 2)),
        tensor_active=0.02,
        dram_active=_clip(0.9 + 0.03 * jitter(seed, s, 4)),
        gr_engine_active=_clip(0.93 + 0.03 * jitter(seed, s, 5)),
        gpu_util=1.0 if uniform(seed, s, 6) > 0.2 else 0.97,
        pcie_rx=model.pcie_bytes_per_s * (0.01 + 0.01 * uniform(seed, s, 7)),
        pcie_tx=model.pcie_bytes_per_s * 0.004,
        fb_used_fraction=0.66 + 0.08 * uniform(seed, 0, 30),
        heat=0.5,
    )


def input_starved(t: float, seed: int, model: GPUModel) -> Activity:
    """Data loader too slow: PCIe RX burst, a short compute phase, then a stall, over 6-10 s cycles."""
    s = int(t)
    period = 6.0 + 4.0 * uniform(seed, 0, 10)
    p = _phase(t, seed, period)
    fb = 0.7 + 0.1 * uniform(seed, 0, 30)
    if p < 0.2:  # copying the next batch in: PCIe RX at a large share of the link
        return Activity(
            sm_active=0.02,
            sm_occupancy=0.01,
            dram_active=0.08,
            gr_engine_active=0.05,
            gpu_util=0.05 + 0.05 * uniform(seed, s, 3),
            pcie_rx=model.pcie_bytes_per_s * (0.35 + 0.15 * uniform(seed, s, 4)),
            pcie_tx=model.pcie_bytes_per_s * 0.01,
            fb_used_fraction=fb,
            heat=0.3,
            power_load=0.12,
        )
    if p < 0.5:  # compute on the batch; power ramps up: the rising edge of the sawtooth
        ramp = (p - 0.2) / 0.3
        return Activity(
            sm_active=_clip(0.72 + 0.05 * jitter(seed, s, 1)),
            sm_occupancy=0.42,
            tensor_active=0.45,
            dram_active=0.38,
            gr_engine_active=0.8,
            gpu_util=1.0,
            pcie_rx=model.pcie_bytes_per_s * 0.01,
            pcie_tx=model.pcie_bytes_per_s * 0.005,
            fb_used_fraction=fb,
            heat=0.3,
            power_load=0.3 + 0.5 * ramp,
        )
    # waiting for the data loader: nearly nothing runs, power falls back
    rx, tx = _background_pcie(seed, s)
    return Activity(
        sm_active=0.01,
        gr_engine_active=0.02,
        gpu_util=0.02 * uniform(seed, s, 3),
        pcie_rx=rx,
        pcie_tx=tx,
        fb_used_fraction=fb,
        heat=0.3,
        power_load=0.04,
    )


def communication_bound(t: float, seed: int, model: GPUModel) -> Activity:
    """Waiting on all-reduce: NCCL kernels keep the engine busy on few SMs while links are saturated."""
    s = int(t)
    p = _phase(t, seed, 3.0)
    computing = p < 0.2
    link = 0.35 + 0.15 * uniform(seed, s, 7)
    if model.has_nvlink:
        nvlink = 0.05 * link * model.nvlink_bytes_per_s if computing else link * model.nvlink_bytes_per_s
        pcie = model.pcie_bytes_per_s * 0.02
    else:  # network (GPUDirect RDMA) traffic crosses PCIe
        nvlink = 0.0
        pcie = model.pcie_bytes_per_s * (0.05 if computing else 0.6 * link / 0.5)
    return Activity(
        sm_active=_clip((0.6 if computing else 0.12) + 0.03 * jitter(seed, s, 1)),
        sm_occupancy=0.12,
        tensor_active=0.3 if computing else 0.0,
        dram_active=0.25,
        gr_engine_active=0.9,
        gpu_util=1.0 if uniform(seed, s, 5) > 0.3 else 0.95,
        pcie_rx=pcie,
        pcie_tx=pcie,
        nvlink_rx=nvlink,
        nvlink_tx=nvlink,
        fb_used_fraction=0.8 + 0.05 * uniform(seed, 0, 30),
        heat=0.4,
    )


def low_occupancy(t: float, seed: int, model: GPUModel) -> Activity:
    """Batch too small: every SM has a warp, but few warps per SM."""
    s = int(t)
    return Activity(
        sm_active=_clip(0.8 + 0.04 * jitter(seed, s, 1)),
        sm_occupancy=_clip(0.1 + 0.02 * jitter(seed, s, 2)),
        tensor_active=_clip(0.2 + 0.03 * jitter(seed, s, 3)),
        dram_active=_clip(0.2 + 0.03 * jitter(seed, s, 4)),
        gr_engine_active=0.95,
        gpu_util=1.0,
        pcie_rx=model.pcie_bytes_per_s * 0.02,
        pcie_tx=model.pcie_bytes_per_s * 0.005,
        fb_used_fraction=0.3 + 0.1 * uniform(seed, 0, 30),
        heat=0.5,
    )


def no_tensor_cores(t: float, seed: int, model: GPUModel) -> Activity:
    """FP32 math on the CUDA cores: moderate SM activity, tensor pipe idle."""
    s = int(t)
    return Activity(
        sm_active=_clip(0.52 + 0.05 * jitter(seed, s, 1)),
        sm_occupancy=_clip(0.35 + 0.03 * jitter(seed, s, 2)),
        tensor_active=0.0,
        dram_active=_clip(0.35 + 0.04 * jitter(seed, s, 4)),
        gr_engine_active=0.9,
        gpu_util=1.0,
        pcie_rx=model.pcie_bytes_per_s * 0.02,
        pcie_tx=model.pcie_bytes_per_s * 0.005,
        fb_used_fraction=0.6 + 0.1 * uniform(seed, 0, 30),
        heat=0.55,
    )


def fake_load(t: float, seed: int, model: GPUModel) -> Activity:
    """A keep-alive or spin kernel: a kernel is always resident (GPU_UTIL 100 %) on a handful of SMs."""
    s = int(t)
    return Activity(
        sm_active=_clip(0.05 + 0.01 * jitter(seed, s, 1)),
        sm_occupancy=0.02,
        dram_active=0.01,
        gr_engine_active=0.98,
        gpu_util=1.0 if uniform(seed, s, 5) > 0.05 else 0.99,
        pcie_rx=40e3,
        pcie_tx=30e3,
        fb_used_fraction=0.05 + 0.05 * uniform(seed, 0, 30),
        heat=0.12,
    )


def bursty_inference(t: float, seed: int, model: GPUModel) -> Activity:
    """An inference server under light traffic: 1.5-2.5 s bursts every 6-10 s (gaps < a window)."""
    s = int(t)
    period = 6.0 + 4.0 * uniform(seed, 0, 10)
    burst = 1.5 + 1.0 * uniform(seed, 0, 11)
    fb = 0.45 + 0.1 * uniform(seed, 0, 30)
    if _phase(t, seed, period) * period < burst:
        return Activity(
            sm_active=_clip(0.72 + 0.06 * jitter(seed, s, 1)),
            sm_occupancy=0.35,
            tensor_active=0.45,
            dram_active=0.4,
            gr_engine_active=0.85,
            gpu_util=1.0,
            pcie_rx=2e9 + 1e9 * uniform(seed, s, 6),
            pcie_tx=1e9,
            fb_used_fraction=fb,
            heat=0.25,
        )
    rx, tx = _background_pcie(seed, s)
    return Activity(pcie_rx=rx, pcie_tx=tx, fb_used_fraction=fb, heat=0.25)


def thermal_throttled(t: float, seed: int, model: GPUModel) -> Activity:
    """Busy GPU with failing cooling: hot, clocks pulled down, thermal slowdown bits set."""
    s = int(t)
    events = ClockEvent.SW_THERMAL
    if uniform(seed, s, 8) < 0.4:
        events |= ClockEvent.HW_THERMAL | ClockEvent.HW_SLOWDOWN
    return Activity(
        sm_active=_clip(0.7 + 0.04 * jitter(seed, s, 1)),
        sm_occupancy=0.4,
        tensor_active=0.45,
        dram_active=0.4,
        gr_engine_active=0.85,
        gpu_util=1.0,
        pcie_rx=model.pcie_bytes_per_s * 0.03,
        pcie_tx=model.pcie_bytes_per_s * 0.005,
        fb_used_fraction=0.8,
        heat=1.0,
        temp_offset_c=16.0,
        sm_clock_fraction=0.62,
        clock_events=int(events),
    )


def memory_pressure(t: float, seed: int, model: GPUModel) -> Activity:
    """A leak or growing cache: framebuffer use climbs ~0.25 %/s from 85 % and levels off at 98.5 %."""
    s = int(t)
    return Activity(
        sm_active=_clip(0.6 + 0.04 * jitter(seed, s, 1)),
        sm_occupancy=0.4,
        tensor_active=0.4,
        dram_active=0.45,
        gr_engine_active=0.8,
        gpu_util=1.0,
        pcie_rx=model.pcie_bytes_per_s * 0.02,
        pcie_tx=model.pcie_bytes_per_s * 0.005,
        fb_used_fraction=min(0.985, 0.85 + 0.0025 * t),
        heat=0.6,
    )


PROFILES: Final[dict[str, Profile]] = {
    name: Profile(name, (fn.__doc__ or "").strip().splitlines()[0], fn)
    for name, fn in (
        ("idle", idle),
        ("idle-holding-memory", idle_holding_memory),
        ("compute-bound", compute_bound),
        ("memory-bound", memory_bound),
        ("input-starved", input_starved),
        ("communication-bound", communication_bound),
        ("low-occupancy", low_occupancy),
        ("no-tensor-cores", no_tensor_cores),
        ("fake-load", fake_load),
        ("bursty-inference", bursty_inference),
        ("thermal-throttled", thermal_throttled),
        ("memory-pressure", memory_pressure),
    )
}

_POWER_WEIGHTS = (0.08, 0.5, 0.25, 0.2)  # gr engine, SM, tensor, DRAM share of the dynamic power


def readings(activity: Activity, model: GPUModel, seed: int, t: float) -> dict[str, float]:
    """dcgm-exporter values of one GPU doing ``activity``; counters and fault fields are left out."""
    step = int(t)
    a = activity
    busy = a.gpu_util > 0.0 or a.sm_active > 0.001
    if a.power_load is not None:
        load = a.power_load
    else:
        w_gr, w_sm, w_tensor, w_dram = _POWER_WEIGHTS
        load = (
            w_gr * a.gr_engine_active
            + w_sm * a.sm_active
            + w_tensor * a.tensor_active
            + w_dram * a.dram_active
        )
    dynamic = model.max_power_w - model.idle_power_w
    power = model.idle_power_w * (1.0 + 0.02 * jitter(seed, step, 40)) + dynamic * _clip(
        load * (1.0 + 0.03 * jitter(seed, step, 41))
    )
    events = a.clock_events
    if not busy:
        events |= ClockEvent.GPU_IDLE
    if power >= 0.97 * model.max_power_w:
        events |= ClockEvent.SW_POWER_CAP
    temp = (
        model.idle_temp_c
        + (model.max_temp_c - model.idle_temp_c) * a.heat
        + a.temp_offset_c
        + 0.6 * jitter(seed, step, 42)
    )
    usable = model.fb_total_mib - model.fb_reserved_mib
    fb_used = round(usable * _clip(a.fb_used_fraction))
    sm_clock = (
        model.sm_clock_max_mhz * a.sm_clock_fraction - 15 * uniform(seed, step, 43)
        if busy
        else model.sm_clock_idle_mhz
    )
    return {
        catalog.SM_CLOCK: round(sm_clock),
        catalog.MEM_CLOCK: model.mem_clock_mhz,
        Signal.MEMORY_TEMP: round(temp + 3.0 + 6.0 * a.dram_active),
        Signal.GPU_TEMP: round(temp),
        Signal.POWER: round(min(power, model.max_power_w), 3),
        Signal.GPU_UTIL: round(100.0 * _clip(a.gpu_util)),
        catalog.MEM_COPY_UTIL: round(100.0 * _clip(a.dram_active * 0.9)),
        Signal.FB_USED: fb_used,
        Signal.FB_FREE: usable - fb_used,
        catalog.FB_RESERVED: model.fb_reserved_mib,
        catalog.CLOCK_EVENTS_NEW: int(events),
        # An idle GPU lowers its link speed to save power (Gen1); the lanes stay.
        Signal.PCIE_MAX_LINK_GEN: model.pcie_gen,
        Signal.PCIE_MAX_LINK_WIDTH: model.pcie_width,
        Signal.PCIE_LINK_GEN: model.pcie_gen if busy else 1,
        Signal.PCIE_LINK_WIDTH: model.pcie_width,
        Signal.GR_ENGINE_ACTIVE: round(_clip(a.gr_engine_active), 6),
        Signal.SM_ACTIVE: round(_clip(a.sm_active), 6),
        Signal.SM_OCCUPANCY: round(_clip(a.sm_occupancy), 6),
        Signal.TENSOR_ACTIVE: round(_clip(a.tensor_active), 6),
        Signal.DRAM_ACTIVE: round(_clip(a.dram_active), 6),
        Signal.PCIE_RX_BYTES: round(a.pcie_rx),
        Signal.PCIE_TX_BYTES: round(a.pcie_tx),
        Signal.NVLINK_RX_BYTES: round(a.nvlink_rx),
        Signal.NVLINK_TX_BYTES: round(a.nvlink_tx),
    }


def sample(profile: str, t: float, seed: int, model: GPUModel) -> dict[str, float]:
    """Readings of ``profile`` at ``t`` seconds (since the scenario started) for the GPU with ``seed``."""
    return readings(PROFILES[profile].fn(t, seed, model), model, seed, t)
