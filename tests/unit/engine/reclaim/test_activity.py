"""Activity fallback chain and data sufficiency (safety rule 1: absence of data is never idleness)."""

import math
from dataclasses import replace

import pytest
from tests.unit.engine.builders import NOW, gpu, policy, stats

from gpu_efficiency.engine.model import Signal, Stats, Window
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.reclaim.activity import (
    ACTIVITY_CHAIN,
    UNBOUNDED,
    DataBounds,
    GPUActivity,
    data_bounds,
    gpu_activity,
    insufficiency,
)

PARAMS = cycle_params(policy())  # window 10m, scrape 15s, minCoverage 0.6, maxStaleness 2m
SM, GR, UTIL = Signal.SM_ACTIVE, Signal.GR_ENGINE_ACTIVE, Signal.GPU_UTIL
SM_UPPER = ACTIVITY_CHAIN[0][1]


def activity_of(signals: dict[Signal, Stats], expected: float | None = 40.0) -> GPUActivity:
    sample = gpu("GPU-0", signals, ("ns", "p"), expected=expected)
    return gpu_activity(sample, data_bounds(sample, PARAMS, NOW))


@pytest.mark.parametrize(
    ("signals", "signal", "peak", "avg"),
    [
        ({SM: stats(0.2, 0.5), GR: stats(0.3, 0.6), UTIL: stats(90.0, 100.0)}, SM, 0.5, 0.2),
        ({GR: stats(0.3, 0.6), UTIL: stats(90.0, 100.0)}, GR, 0.6, 0.3),
        ({UTIL: stats(40.0, 80.0)}, UTIL, 0.8, 0.4),  # percent scaled to a fraction
        # a present but unusable signal falls through to the next usable one
        ({SM: stats(0.0, count=3), GR: stats(0.3, 0.6)}, GR, 0.6, 0.3),
        ({SM: stats(math.nan), GR: stats(0.3, age=999.0), UTIL: stats(10.0, 20.0)}, UTIL, 0.2, 0.1),
    ],
)
def test_fallback_chain_picks_first_usable_signal(
    signals: dict[Signal, Stats], signal: Signal, peak: float, avg: float
) -> None:
    activity = activity_of(signals)
    assert activity.known
    assert activity.signal is signal
    assert activity.peak == pytest.approx(peak)
    assert activity.avg == pytest.approx(avg)


@pytest.mark.parametrize(
    ("signals", "why"),
    [
        ({}, "no samples"),
        ({Signal.POWER: stats(100.0)}, "no activity signal"),
        ({SM: stats(0.0, count=23)}, "23 samples in the window, 24 needed"),  # 40 x 0.6 = 24
        ({SM: stats(0.0, count=0)}, "0 samples"),
        ({SM: stats(0.0, age=121.0)}, "stale"),
        ({SM: Stats(0.0, 0.0, 0.0, 0.0, 40, math.nan)}, "stale"),
        ({SM: stats(math.nan)}, "out of range"),
        ({SM: stats(0.0, math.inf)}, "out of range"),
        ({SM: stats(-0.1, 0.0)}, "out of range"),
        ({SM: stats(0.5, 1.2)}, "out of range"),  # fraction above 1
        ({UTIL: stats(50.0, 101.0)}, "out of range"),  # percent above 100
        ({SM: stats(math.nan), GR: stats(0.0, count=1), UTIL: stats(0.0, age=500.0)}, "DCGM_FI_DEV_GPU_UTIL"),
    ],
)
def test_insufficient_data_is_unknown_never_idle(signals: dict[Signal, Stats], why: str) -> None:
    activity = activity_of(signals)
    assert not activity.known
    assert activity.signal is None
    assert math.isnan(activity.peak)  # NaN < threshold is False: can never read as idle
    assert why in activity.unknown_reason


def test_exactly_enough_samples_and_exactly_max_staleness_are_usable() -> None:
    assert activity_of({SM: stats(0.0, count=24, age=120.0)}).known


def test_expected_samples_fall_back_to_policy_window_over_scrape_interval() -> None:
    # no expected count from the source: 10m / 15s = 40 expected, 24 needed
    assert not activity_of({SM: stats(0.0, count=20)}, expected=None).known
    assert activity_of({SM: stats(0.0, count=24)}, expected=None).known


def test_source_expected_samples_override_policy() -> None:
    # a 30s scrape interval: 20 expected, 12 needed
    assert activity_of({SM: stats(0.0, count=12)}, expected=20.0).known


def test_fraction_tolerance_accepts_rounding_above_one() -> None:
    assert activity_of({SM: stats(1.0, 1.0000001)}).known


def test_insufficiency_of_unbounded_signal_rejects_infinity() -> None:
    bounds = DataBounds(needed=1.0, oldest=NOW - 60)
    assert insufficiency(stats(1e12), UNBOUNDED, bounds) == ""
    assert "out of range" in insufficiency(stats(math.inf), UNBOUNDED, bounds)
    assert insufficiency(None, UNBOUNDED, bounds) == "no samples"


FRESH_NEWEST, STALE_NEWEST = NOW - 5.0, NOW - 500.0  # maxStaleness 2m


@pytest.mark.parametrize("fetched_ts", [NOW - 900.0, NOW - 5.0, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("newest", [FRESH_NEWEST, STALE_NEWEST, math.nan])
def test_carried_window_is_judged_as_if_its_times_were_the_gpus_newest(
    fetched_ts: float, newest: float
) -> None:
    """carried_bounds on the fetched Stats gives what substituting identity's newest time into
    every finite sample time gave (NaN and infinite times kept as they were)."""
    sample = gpu("GPU-0", {SM: Stats(0.4, 0.6, 0.1, 0.5, 40, fetched_ts)}, ("ns", "p"), expected=40.0)
    substituted = Stats(0.4, 0.6, 0.1, 0.5, 40, newest if math.isfinite(fetched_ts) else fetched_ts)
    carried = replace(sample, carried_newest=newest)
    bounds = data_bounds(sample, PARAMS, NOW)
    assert insufficiency(carried.stats[Window.ACTIVITY][SM], SM_UPPER, data_bounds(carried, PARAMS, NOW)) == (
        insufficiency(substituted, SM_UPPER, bounds)
    )


def test_carried_freshness_decides_the_verdict_whatever_the_fetched_time() -> None:
    old = {SM: stats(0.0, age=900.0)}  # idle figures fetched 15 minutes ago
    sample = gpu("GPU-0", old, ("ns", "p"), expected=40.0)
    assert "stale" in gpu_activity(sample, data_bounds(sample, PARAMS, NOW)).unknown_reason
    fresh = replace(sample, carried_newest=FRESH_NEWEST)
    assert gpu_activity(fresh, data_bounds(fresh, PARAMS, NOW)).peak == 0.0
    gone = replace(sample, carried_newest=math.nan)  # identity gave no time: never fresh
    assert not gpu_activity(gone, data_bounds(gone, PARAMS, NOW)).known
