"""Profiles: values in the exporter's ranges, and the shapes each profile claims."""

from __future__ import annotations

import itertools
import statistics

import pytest

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.gpu_models import MODELS, GPUModel, find_model
from gpu_efficiency_sim.profiles import PROFILES, sample

H100 = find_model("NVIDIA-H100-80GB-HBM3")
RATIOS = (
    Signal.SM_ACTIVE,
    Signal.GR_ENGINE_ACTIVE,
    Signal.SM_OCCUPANCY,
    Signal.TENSOR_ACTIVE,
    Signal.DRAM_ACTIVE,
)


def series(
    profile: str, signal: str, *, seconds: int = 120, seed: int = 7, model: GPUModel = H100
) -> list[float]:
    return [float(sample(profile, float(t), seed, model)[signal]) for t in range(seconds)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.product)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_values_stay_in_the_exporters_ranges(profile: str, model: GPUModel) -> None:
    for t in range(0, 90, 3):
        values = sample(profile, float(t), 11, model)
        for ratio in RATIOS:
            assert 0.0 <= values[ratio] <= 1.0, (ratio, values[ratio])
        assert 0 <= values[Signal.GPU_UTIL] <= 100
        assert isinstance(values[Signal.GPU_UTIL], int)
        assert model.idle_power_w * 0.9 <= values[Signal.POWER] <= model.max_power_w
        assert (
            values[Signal.FB_USED] + values[Signal.FB_FREE] + values[catalog.FB_RESERVED]
            == model.fb_total_mib
        )
        assert 20 <= values[Signal.GPU_TEMP] <= 110
        assert values[Signal.MEMORY_TEMP] >= values[Signal.GPU_TEMP]
        for traffic in (
            Signal.PCIE_RX_BYTES,
            Signal.PCIE_TX_BYTES,
            Signal.NVLINK_RX_BYTES,
            Signal.NVLINK_TX_BYTES,
        ):
            assert values[traffic] >= 0
        if not model.has_nvlink:
            assert values[Signal.NVLINK_RX_BYTES] == 0


def test_profiles_are_deterministic_per_seed_and_differ_between_gpus() -> None:
    assert sample("compute-bound", 42.0, 1, H100) == sample("compute-bound", 42.0, 1, H100)
    assert series("compute-bound", Signal.SM_ACTIVE, seed=1) != series(
        "compute-bound", Signal.SM_ACTIVE, seed=2
    )


def test_idle_is_zero_activity_at_idle_power_with_empty_memory() -> None:
    for t in range(60):
        v = sample("idle", float(t), 3, H100)
        assert v[Signal.SM_ACTIVE] == 0
        assert v[Signal.GPU_UTIL] == 0
        assert v[Signal.GR_ENGINE_ACTIVE] == 0
        assert v[Signal.FB_USED] == 0
        assert abs(v[Signal.POWER] - 70.0) < 3.0
        assert v[catalog.CLOCK_EVENTS_NEW] & catalog.ClockEvent.GPU_IDLE
        assert v[catalog.SM_CLOCK] == H100.sm_clock_idle_mhz


def test_idle_holding_memory_holds_memory_without_activity() -> None:
    fb = series("idle-holding-memory", Signal.FB_USED)
    assert min(fb) > 0.5 * H100.fb_total_mib
    assert max(series("idle-holding-memory", Signal.SM_ACTIVE)) < 0.01


def test_compute_bound_is_busy_near_the_power_limit() -> None:
    assert min(series("compute-bound", Signal.SM_ACTIVE)) > 0.8
    assert statistics.mean(series("compute-bound", Signal.TENSOR_ACTIVE)) > 0.5
    assert statistics.mean(series("compute-bound", Signal.POWER)) > 0.7 * H100.max_power_w


def test_input_starved_oscillates_with_pcie_bursts_and_a_power_sawtooth() -> None:
    util = [u / 100 for u in series("input-starved", Signal.GPU_UTIL)]
    assert statistics.pstdev(util) > 0.3
    assert statistics.mean(series("input-starved", Signal.SM_ACTIVE)) < 0.3
    rx = series("input-starved", Signal.PCIE_RX_BYTES)
    assert max(rx) > 1e9 > statistics.median(rx)
    # Sawtooth: power climbs during each compute phase, then drops sharply.
    power = series("input-starved", Signal.POWER)
    rises = sum(1 for a, b in itertools.pairwise(power) if b > a + 50)
    drops = sum(1 for a, b in itertools.pairwise(power) if b < a - 200)
    assert rises >= 10
    assert drops >= 10


def test_bursty_inference_peaks_high_in_every_window_but_averages_low() -> None:
    sm = series("bursty-inference", Signal.SM_ACTIVE, seconds=300)
    assert statistics.mean(sm) < 0.35
    for start in range(0, 280):
        assert max(sm[start : start + 20]) > 0.5, f"a 20 s window from {start}s has no burst"
    gaps = [len(run) for run in "".join("b" if x > 0.3 else "." for x in sm).split("b") if run]
    assert max(gaps) < 20


def test_fake_load_reads_full_utilisation_with_almost_no_sm_activity() -> None:
    assert min(series("fake-load", Signal.GPU_UTIL)) >= 99
    assert max(series("fake-load", Signal.SM_ACTIVE)) < 0.1
    assert min(series("fake-load", Signal.GR_ENGINE_ACTIVE)) > 0.9


def test_memory_bound_saturates_dram_with_low_sm() -> None:
    assert min(series("memory-bound", Signal.DRAM_ACTIVE)) > 0.8
    assert max(series("memory-bound", Signal.SM_ACTIVE)) < 0.3


def test_communication_bound_saturates_links_with_low_sm() -> None:
    assert statistics.mean(series("communication-bound", Signal.SM_ACTIVE)) < 0.3
    assert max(series("communication-bound", Signal.NVLINK_RX_BYTES)) > 5e9
    l4 = find_model("NVIDIA-L4")
    assert max(series("communication-bound", Signal.PCIE_RX_BYTES, model=l4)) > 5e9


def test_low_occupancy_is_busy_sms_with_few_warps() -> None:
    assert min(series("low-occupancy", Signal.SM_ACTIVE)) > 0.5
    assert max(series("low-occupancy", Signal.SM_OCCUPANCY)) < 0.2


def test_no_tensor_cores_is_moderate_sm_with_an_idle_tensor_pipe() -> None:
    sm = series("no-tensor-cores", Signal.SM_ACTIVE)
    assert min(sm) > 0.3
    assert max(sm) < 0.7
    assert max(series("no-tensor-cores", Signal.TENSOR_ACTIVE)) < 0.01


def test_thermal_throttled_is_hot_with_thermal_slowdown_bits() -> None:
    assert min(series("thermal-throttled", Signal.GPU_TEMP)) >= 88
    bits = [int(b) for b in series("thermal-throttled", catalog.CLOCK_EVENTS_NEW)]
    assert all(b & catalog.ClockEvent.SW_THERMAL for b in bits)
    assert any(b & catalog.ClockEvent.HW_THERMAL and b & catalog.ClockEvent.HW_SLOWDOWN for b in bits)
    assert max(series("thermal-throttled", catalog.SM_CLOCK)) < 0.7 * H100.sm_clock_max_mhz


def test_memory_pressure_climbs_towards_the_limit() -> None:
    used = series("memory-pressure", Signal.FB_USED)
    free = series("memory-pressure", Signal.FB_FREE)
    fraction = [u / (u + f) for u, f in zip(used, free, strict=True)]
    assert fraction[0] < 0.9
    assert fraction[60] >= 0.95
    assert all(b >= a for a, b in itertools.pairwise(fraction))
