"""Per-GPU fault rules: ECC, XID, thermal. Table-driven, plus hypothesis properties on garbage."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as s
from tests.unit.engine.quarantine.support import NAN, NOW, counter, gpu, policy, st
from tests.unit.positive_control import reached

from gpu_efficiency.api.policy import DEFAULT_CRITICAL_XIDS, DEFAULT_IGNORED_XIDS, ThermalFault
from gpu_efficiency.engine.model import Signal, Stats, Window
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.quarantine.data import data_rules
from gpu_efficiency.engine.quarantine.ecc import judge_ecc
from gpu_efficiency.engine.quarantine.kinds import GpuState
from gpu_efficiency.engine.quarantine.thermal import (
    all_in_range_have,
    judge_thermal,
    none_in_range_have,
)
from gpu_efficiency.engine.quarantine.xid import judge_xid

RULES = data_rules(cycle_params(policy()), NOW)
CRITICAL = frozenset(DEFAULT_CRITICAL_XIDS)
IGNORED = frozenset(DEFAULT_IGNORED_XIDS)
FAULT, HEALTHY, PENDING, UNKNOWN = GpuState.FAULT, GpuState.HEALTHY, GpuState.PENDING, GpuState.UNKNOWN

# ---- ECC ------------------------------------------------------------------------------------------

DBE = Signal.ECC_DBE_VOLATILE
ROWS = Signal.REMAPPED_ROWS_UNCORRECTABLE
FAIL = Signal.ROW_REMAP_FAILURE
PENDING_PAGES = Signal.RETIRED_PAGES_PENDING


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param({}, HEALTHY, id="all-clean"),
        pytest.param({DBE: counter(0, 1)}, FAULT, id="dbe-increase"),
        pytest.param({DBE: counter(4, 6)}, FAULT, id="dbe-increase-from-history"),
        pytest.param({DBE: st(6, low=4, high=6)}, FAULT, id="dbe-increase-without-first"),
        pytest.param({DBE: counter(3, 3)}, HEALTHY, id="dbe-old-errors-not-increasing"),
        pytest.param({DBE: counter(0, 1, resets=1)}, UNKNOWN, id="dbe-counter-reset"),
        pytest.param({DBE: counter(-3, 1)}, UNKNOWN, id="dbe-negative"),
        pytest.param({DBE: counter(5, 1)}, UNKNOWN, id="dbe-decreasing"),
        pytest.param({DBE: st(NAN)}, UNKNOWN, id="dbe-nan"),
        pytest.param({DBE: st(math.inf, low=0, high=math.inf)}, UNKNOWN, id="dbe-inf"),
        pytest.param({DBE: counter(0, 1, count=2)}, UNKNOWN, id="dbe-too-sparse"),
        pytest.param({DBE: counter(0, 1, age=600)}, UNKNOWN, id="dbe-stale"),
        pytest.param({DBE: None}, UNKNOWN, id="dbe-missing"),
        pytest.param({ROWS: counter(2, 3)}, FAULT, id="remapped-rows-increase"),
        pytest.param({ROWS: counter(2, 2)}, HEALTHY, id="remapped-rows-old"),
        pytest.param({FAIL: st(1, low=NAN)}, FAULT, id="row-remap-failure"),
        pytest.param({FAIL: st(-1, low=NAN)}, UNKNOWN, id="row-remap-failure-negative"),
        pytest.param({PENDING_PAGES: st(2, low=NAN)}, FAULT, id="retired-pages-pending"),
        pytest.param({ROWS: None, FAIL: None, PENDING_PAGES: None}, HEALTHY, id="optional-signals-absent"),
        pytest.param({DBE: counter(0, 1, resets=1), FAIL: st(1)}, FAULT, id="garbage-dbe-but-clean-failure"),
        pytest.param({FAIL: st(1, count=1)}, UNKNOWN, id="sparse-failure-is-no-fault"),
    ],
)
def test_ecc_rule(fault: dict[Signal, Stats | None], expected: GpuState) -> None:
    judgement = judge_ecc(gpu("n1", fault=fault), RULES)
    assert judgement.state is expected, judgement


def test_ecc_fingerprint_and_summary_name_the_values() -> None:
    judgement = judge_ecc(gpu("n1", fault={DBE: counter(2, 3), FAIL: st(1)}), RULES)
    assert judgement.fingerprint["dbe"] == 3
    assert judgement.fingerprint["remapFailure"] == 1
    assert set(judgement.triggered) == {"dbe", "remapFailure"}
    assert "dbe=3 (+1)" in judgement.summary


def _garbage_counter() -> s.SearchStrategy[Stats]:
    finite = s.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
    return s.one_of(
        s.builds(lambda a, b: counter(a, b, resets=1), finite, finite),  # a reset
        s.builds(lambda a, b: counter(-abs(a) - 1, b), finite, finite),  # negative
        s.builds(lambda a, b: counter(abs(a) + abs(b) + 1, abs(b)), finite, finite),  # decreasing
        s.builds(lambda a: st(NAN, low=a, high=a), finite),  # NaN
        s.builds(lambda a, b: counter(0, a + 1, count=b), s.floats(0, 10), s.integers(0, 4)),  # sparse
    )


@settings(max_examples=80, deadline=None)
@given(garbage=_garbage_counter())
def test_garbage_counters_are_never_a_fault(garbage: Stats) -> None:
    fault = {DBE: garbage, ROWS: garbage}
    assert judge_ecc(gpu("n1", fault=fault), RULES).state is UNKNOWN


# ---- XID ------------------------------------------------------------------------------------------


def _xid(stats: Stats | None, **kw: Stats | None) -> GpuState:
    fault = {Signal.XID: stats, **{Signal[k]: v for k, v in kw.items()}}
    return judge_xid(gpu("n1", fault=fault), RULES, taints=lambda x: x in CRITICAL and x not in IGNORED).state


@pytest.mark.parametrize(
    ("xid", "expected"),
    [
        pytest.param(st(79, low=0, high=79, changes=1), FAULT, id="critical-change"),
        pytest.param(st(48, low=13, high=48, changes=2), FAULT, id="critical-after-another"),
        pytest.param(st(13, low=0, high=13, changes=1), HEALTHY, id="ignored-change"),
        pytest.param(st(999, low=0, high=999, changes=1), HEALTHY, id="unlisted-change"),
        pytest.param(st(79), HEALTHY, id="critical-value-staying-is-history"),
        pytest.param(st(0, low=0, high=79, changes=1), HEALTHY, id="back-to-zero"),
        pytest.param(st(79.5, changes=1), UNKNOWN, id="not-an-integer"),
        pytest.param(st(-79, changes=1), UNKNOWN, id="negative"),
        pytest.param(st(NAN, changes=1), UNKNOWN, id="nan"),
        pytest.param(st(79, changes=1, age=600), UNKNOWN, id="stale"),
        pytest.param(None, UNKNOWN, id="missing"),
        pytest.param(st(79, count=2), FAULT, id="series-appeared-in-window"),
        pytest.param(st(13, count=2), HEALTHY, id="ignored-series-appeared"),
    ],
)
def test_xid_rule(xid: Stats | None, expected: GpuState) -> None:
    assert _xid(xid) is expected


def test_thin_xid_series_without_dense_siblings_is_unknown_not_new() -> None:
    thin = {
        name: st(0, count=2) for name in ("ECC_DBE_VOLATILE", "ROW_REMAP_FAILURE", "RETIRED_PAGES_PENDING")
    }
    assert _xid(st(79, count=2), REMAPPED_ROWS_UNCORRECTABLE=None, **thin) is UNKNOWN


def test_xid_lists_come_from_the_policy() -> None:
    sample = gpu("n1", fault={Signal.XID: st(31, low=0, high=31, changes=1)})
    assert judge_xid(sample, RULES, taints=lambda x: x == 31).state is FAULT


@settings(max_examples=60, deadline=None)
@given(value=s.sampled_from(sorted(IGNORED)), changes=s.integers(0, 5), count=s.integers(1, 8))
def test_ignored_xids_never_fault(value: int, changes: int, count: int) -> None:
    assert _xid(st(value, low=0, high=value, changes=changes, count=count)) is not FAULT


@settings(max_examples=60, deadline=None)
@given(value=s.sampled_from(sorted(CRITICAL)))
def test_an_unchanged_fully_covered_gauge_never_faults(value: int) -> None:
    assert _xid(st(value)) is HEALTHY


# ---- thermal: bitmask bounds ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(low=s.integers(0, 600), span=s.integers(0, 200), mask=s.integers(1, 511))
def test_bitmask_range_proofs_match_brute_force(low: int, span: int, mask: int) -> None:
    values = range(low, low + span + 1)
    assert all_in_range_have(low, low + span, mask) == all(v & mask for v in values)
    assert none_in_range_have(low, low + span, mask) == (not any(v & mask for v in values))


# ---- thermal: rule --------------------------------------------------------------------------------

GPU_TEMP, MEM_TEMP, CLOCKS = Signal.GPU_TEMP, Signal.MEMORY_TEMP, Signal.CLOCK_EVENTS


@pytest.mark.parametrize(
    ("hold", "recovery", "expected"),
    [
        pytest.param({}, {}, HEALTHY, id="cool"),
        pytest.param({GPU_TEMP: st(95, low=91, high=97)}, {}, FAULT, id="hot-for-the-whole-hold"),
        pytest.param({GPU_TEMP: st(95, low=80, high=97)}, {}, PENDING, id="hot-for-part-of-the-hold"),
        pytest.param({GPU_TEMP: st(95, low=91, high=97, count=3)}, {}, UNKNOWN, id="hot-but-sparse"),
        pytest.param({GPU_TEMP: st(95, low=91, high=97, age=600)}, {}, UNKNOWN, id="hot-but-stale"),
        pytest.param({MEM_TEMP: st(99, low=96, high=100)}, {}, FAULT, id="memory-hot"),
        pytest.param({CLOCKS: st(0x40)}, {}, FAULT, id="hw-thermal-bit-throughout"),
        pytest.param({CLOCKS: st(0x44, low=0x24, high=0x64)}, {}, FAULT, id="thermal-bits-in-every-value"),
        pytest.param({CLOCKS: st(0x40, low=0x0, high=0x40)}, {}, PENDING, id="thermal-bit-sometimes"),
        pytest.param({CLOCKS: st(0x4, low=0x1, high=0x4)}, {}, HEALTHY, id="power-cap-is-not-thermal"),
        pytest.param({CLOCKS: st(0x40, low=0.5, high=0x40)}, {}, UNKNOWN, id="bitmask-not-integer"),
        pytest.param(
            {}, {GPU_TEMP: st(95, low=60, high=95, count=20)}, PENDING, id="recovery-window-still-hot"
        ),
        pytest.param({}, {GPU_TEMP: st(60, count=5)}, UNKNOWN, id="recovery-window-sparse"),
        pytest.param({}, {GPU_TEMP: None}, UNKNOWN, id="no-temperature-no-recovery"),
        pytest.param({}, {MEM_TEMP: None}, HEALTHY, id="no-memory-temperature-is-fine"),
        pytest.param(
            {}, {CLOCKS: st(0x20, low=0, high=0x20, count=20)}, PENDING, id="recovery-with-slowdown"
        ),
    ],
)
def test_thermal_rule(
    hold: dict[Signal, Stats | None], recovery: dict[Signal, Stats | None], expected: GpuState
) -> None:
    judgement = judge_thermal(gpu("n1", hold=hold, recovery=recovery), RULES, ThermalFault())
    assert judgement.state is expected, judgement


def test_slowdown_bits_ignored_when_disabled() -> None:
    sample = gpu("n1", hold={CLOCKS: st(0x40)})
    assert judge_thermal(sample, RULES, ThermalFault(slowdown_clock_events=False)).state is HEALTHY


def test_thermal_limits_come_from_the_policy() -> None:
    sample = gpu("n1", hold={GPU_TEMP: st(85, low=82, high=86)}, recovery={GPU_TEMP: st(85, count=20)})
    assert judge_thermal(sample, RULES, ThermalFault()).state is HEALTHY
    assert judge_thermal(sample, RULES, ThermalFault(gpu_temperature_above=80)).state is FAULT
    assert judge_thermal(sample, RULES, ThermalFault(gpu_temperature_above=84)).state is PENDING


@settings(max_examples=80, deadline=None)
@given(
    low=s.floats(0, 150),
    spread=s.floats(0, 50),
    count=s.integers(0, 20),
    age=s.floats(0, 1000),
)
def test_thermal_faults_only_with_every_sample_over_the_limit(
    low: float, spread: float, count: int, age: float
) -> None:
    hot = st(low + spread, low=low, high=low + spread, count=count, age=age)
    judgement = judge_thermal(gpu("n1", hold={GPU_TEMP: hot}), RULES, ThermalFault())
    if judgement.state is FAULT:
        assert low > 90.0
        assert count >= 0.6 * 8
        assert age <= 120


def test_the_expected_sample_count_falls_back_to_window_over_scrape() -> None:
    sample = replace(gpu("n1", fault={DBE: counter(0, 1, count=5)}), expected_samples={})
    assert RULES.expected(sample, Window.FAULT) == 8  # 2m lookback / 15s scrape
    assert judge_ecc(sample, RULES).state is FAULT


# ---- positive controls: the "never a fault" properties above are not vacuous ----------------------


@settings(max_examples=80, deadline=None)
@given(start=s.floats(0, 1e6), increase=s.integers(1, 1000))
def test_control_a_sound_counter_that_increases_is_a_fault(start: float, increase: int) -> None:
    """The garbage property's twin: the same counters, sound, are faults, so UNKNOWN above is the
    data rule's doing and not a judge that never says FAULT."""
    assert judge_ecc(gpu("n1", fault={DBE: counter(start, start + increase)}), RULES).state is FAULT


def test_control_critical_xids_fault_on_the_ignored_property_s_draws() -> None:
    """Where an ignored XID stays quiet, a critical one with the same changes and coverage faults."""
    draws = s.tuples(s.sampled_from(sorted(CRITICAL)), s.integers(0, 5), s.integers(1, 8))
    _, changes, count = reached(
        draws, lambda d: _xid(st(d[0], low=0, high=d[0], changes=d[1], count=d[2])) is FAULT
    )
    ignored = min(IGNORED)
    assert _xid(st(ignored, low=0, high=ignored, changes=changes, count=count)) is not FAULT


@settings(max_examples=60, deadline=None)
@given(value=s.sampled_from(sorted(CRITICAL)))
def test_control_a_critical_gauge_that_changed_faults(value: int) -> None:
    """The unchanged-gauge property's twin: the same value, newly shown in the window, faults."""
    assert _xid(st(value, low=0, high=value, changes=1)) is FAULT
