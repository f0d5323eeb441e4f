"""Each diagnosis of the table in docs/what-you-see.md from hand-built readings, its recommendation, and the precedence."""

from collections.abc import Callable

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    NOW,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    pod,
    policy,
    snapshot,
    stats,
)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotatePod, Diagnosis, PodEvent, Signal, Stats, Verdict
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.activity import data_bounds, gpu_activity
from gpu_efficiency.engine.reclaim.underutilization import (
    PRECEDENCE,
    RECOMMENDATIONS,
    Finding,
    diagnose,
    time_to_oom,
)

pytestmark = pytest.mark.usefixtures("no_faults")

PARAMS = cycle_params(policy())


def finding_of(signals: dict[Signal, Stats], fb_total: float | None = b.FB_TOTAL) -> Finding:
    sample = gpu("GPU-0", signals, ("ns", "p"), fb_total_mib=fb_total)
    bounds = data_bounds(sample, PARAMS, NOW)
    activity = gpu_activity(sample, bounds)
    assert activity.known
    return diagnose(signals, activity, PARAMS, bounds, fb_total)


PROFILES: list[tuple[Callable[[], dict[Signal, Stats]], Diagnosis, Verdict, str]] = [
    (b.compute_bound, Diagnosis.COMPUTE_BOUND, Verdict.EFFICIENT, "none"),
    (b.fake_load, Diagnosis.FAKE_LOAD, Verdict.UNDERUTILIZED, "busy-wait polling"),
    (b.memory_bound, Diagnosis.MEMORY_BOUND, Verdict.UNDERUTILIZED, "FlashAttention"),
    (b.input_starved, Diagnosis.INPUT_STARVED, Verdict.UNDERUTILIZED, "num_workers"),
    (b.communication_bound, Diagnosis.COMMUNICATION_BOUND, Verdict.UNDERUTILIZED, "NCCL"),
    (b.low_occupancy, Diagnosis.LOW_OCCUPANCY, Verdict.UNDERUTILIZED, "batch size"),
    (b.no_tensor_cores, Diagnosis.NO_TENSOR_CORES, Verdict.UNDERUTILIZED, "mixed precision"),
    (b.thermal_throttled, Diagnosis.THERMAL_THROTTLING, Verdict.UNDERUTILIZED, "cooling"),
    (b.low_activity, Diagnosis.LOW_COMPUTE, Verdict.UNDERUTILIZED, "Nsight"),
    (b.bursty_inference, Diagnosis.LOW_COMPUTE, Verdict.UNDERUTILIZED, "Nsight"),
]


@pytest.mark.parametrize(("profile", "diagnosis", "verdict", "advice"), PROFILES)
def test_profile_gets_diagnosis_verdict_and_annotations(
    profile: Callable[[], dict[Signal, Stats]], diagnosis: Diagnosis, verdict: Verdict, advice: str
) -> None:
    plan = plan_cycle(snapshot([gpu("GPU-0", profile(), ("team-a", "p"))], [pod("p")]))
    (pod_verdict,) = plan.verdicts
    assert (pod_verdict.verdict, pod_verdict.diagnosis) == (verdict, diagnosis)
    assert advice in pod_verdict.recommendation
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.STATE] == verdict.value
    assert patch.annotations[names.DIAGNOSIS] == diagnosis.value
    assert patch.annotations[names.RECOMMENDATION] == pod_verdict.recommendation
    events = [a.reason for a in plan.actions if isinstance(a, PodEvent)]
    assert events == ([names.EV_UNDERUTILIZED] if verdict is Verdict.UNDERUTILIZED else [])


def test_memory_pressure_on_busy_gpu_is_efficient_with_the_warning() -> None:
    signals = b.compute_bound() | {Signal.FB_USED: stats(79000.0), Signal.FB_FREE: stats(2559.0)}
    plan = plan_cycle(snapshot([gpu("GPU-0", signals, ("team-a", "p"))], [pod("p")]))
    (v,) = plan.verdicts
    assert (v.verdict, v.diagnosis) == (Verdict.EFFICIENT, Diagnosis.MEMORY_PRESSURE)
    assert "97%" in v.reason


def test_memory_pressure_from_trend_predicts_time_to_oom() -> None:
    # 40 GB -> 70 GB linearly over the window: avg 55 GB, newest 70 GB, 81.5 GB total
    signals = b.low_activity(FB_USED=stats(55000.0, 70000.0, last=70000.0))
    finding = finding_of(signals)
    assert finding.diagnosis is Diagnosis.MEMORY_PRESSURE
    assert "out of memory in ~" in finding.evidence


def test_time_to_oom_linear_ramp() -> None:
    fb = stats(55000.0, 70000.0, last=70000.0)
    # slope = 2 x 15000 / 600 = 50 MiB/s; 10000 MiB left -> 200 s
    assert time_to_oom(fb, 80000.0, 600.0) == pytest.approx(200.0)


@pytest.mark.parametrize(
    "fb",
    [
        stats(40000.0),  # flat
        stats(50000.0, 60000.0, last=40000.0),  # falling: newest below the peak
        stats(59000.0, 60000.0, last=60000.0),  # model loaded early in the window, then flat-ish
    ],
)
def test_no_false_oom_prediction(fb: Stats) -> None:
    ttoom = time_to_oom(fb, b.FB_TOTAL, 600.0)
    assert ttoom is None or ttoom > 600.0
    assert finding_of(b.compute_bound() | {Signal.FB_USED: fb}).diagnosis is Diagnosis.COMPUTE_BOUND


def test_fb_total_from_used_plus_free_when_sample_lacks_it() -> None:
    signals = b.compute_bound() | {Signal.FB_USED: stats(79000.0), Signal.FB_FREE: stats(1000.0)}
    assert finding_of(signals, fb_total=None).diagnosis is Diagnosis.MEMORY_PRESSURE


def test_thermal_from_temperature_limit() -> None:
    signals = b.compute_bound() | {Signal.GPU_TEMP: stats(88.0)}
    assert finding_of(signals).diagnosis is Diagnosis.THERMAL_THROTTLING


@pytest.mark.parametrize("bits", [0x1, 0x4, 0x8, 0x80])  # idle, power cap, hw slowdown, power brake
def test_non_thermal_clock_event_bits_are_not_thermal(bits: int) -> None:
    assert finding_of(b.compute_bound() | {Signal.CLOCK_EVENTS: stats(float(bits))}).diagnosis is (
        Diagnosis.COMPUTE_BOUND
    )


def test_input_starved_by_power_sawtooth_without_util_oscillation() -> None:
    signals = b.low_activity(PCIE_RX_BYTES=stats(1e9, 5e9), POWER=stats(200.0, stddev=60.0))
    assert finding_of(signals).diagnosis is Diagnosis.INPUT_STARVED


def test_pcie_bursts_alone_are_not_input_starved() -> None:
    assert finding_of(b.low_activity(PCIE_RX_BYTES=stats(1e9, 5e9))).diagnosis is Diagnosis.LOW_COMPUTE


def test_missing_optional_signal_makes_no_finding() -> None:
    signals = b.no_tensor_cores() | {Signal.SM_ACTIVE: stats(0.45)}
    assert finding_of(signals).diagnosis is Diagnosis.NO_TENSOR_CORES
    del signals[Signal.TENSOR_ACTIVE]
    assert finding_of(signals).diagnosis is Diagnosis.LOW_COMPUTE  # SM 0.45: not efficient, no proof of FP32


def test_nan_optional_signal_makes_no_finding() -> None:
    signals = b.low_activity(DRAM_ACTIVE=stats(float("nan")))
    assert finding_of(signals).diagnosis is Diagnosis.LOW_COMPUTE


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        # communication explains the DRAM traffic and the fake-load reading
        (b.communication_bound() | {Signal.DRAM_ACTIVE: stats(0.9)}, Diagnosis.COMMUNICATION_BOUND),
        # memory-bound explains GPU_UTIL 100 with low SM
        (b.memory_bound(), Diagnosis.MEMORY_BOUND),
        # thermal beats everything
        (b.fake_load() | {Signal.CLOCK_EVENTS: stats(0x20)}, Diagnosis.THERMAL_THROTTLING),
        # memory pressure beats the low-SM findings
        (b.fake_load() | {Signal.FB_USED: stats(80000.0)}, Diagnosis.MEMORY_PRESSURE),
        # no tensor cores before low occupancy when both hold
        (b.compute_bound() | {Signal.SM_ACTIVE: stats(0.6), Signal.SM_OCCUPANCY: stats(0.1),
                              Signal.TENSOR_ACTIVE: stats(0.0)}, Diagnosis.NO_TENSOR_CORES),
    ],
)  # fmt: skip
def test_precedence(signals: dict[Signal, Stats], expected: Diagnosis) -> None:
    assert finding_of(signals).diagnosis is expected


def test_efficiency_score_is_activity_over_gpu_util() -> None:
    finding = finding_of(b.fake_load())
    assert finding.efficiency == pytest.approx(5.0)  # 0.05 / 1.00 x 100
    assert finding.gpu_util == pytest.approx(1.0)


def test_efficiency_unknown_when_activity_comes_from_gpu_util() -> None:
    signals = {Signal.GPU_UTIL: stats(100.0)}
    finding = finding_of(signals)
    assert finding.efficiency is None
    assert finding.diagnosis is Diagnosis.COMPUTE_BOUND  # no way to tell fake load without SM activity


def test_thresholds_come_from_the_policy() -> None:
    strict = cycle_params(policy(underutilization={"efficient_sm_active_above": 0.95}))
    signals = b.compute_bound()
    sample = gpu("GPU-0", signals, ("ns", "p"))
    bounds = data_bounds(sample, strict, NOW)
    finding = diagnose(signals, gpu_activity(sample, bounds), strict, bounds)
    assert finding.diagnosis is Diagnosis.LOW_COMPUTE


def test_every_diagnosis_has_a_recommendation_and_a_rank() -> None:
    for diagnosis in Diagnosis:
        assert RECOMMENDATIONS[diagnosis]
    assert set(PRECEDENCE) == set(Diagnosis) - {Diagnosis.IDLE, Diagnosis.INSUFFICIENT_DATA}


def test_multi_gpu_pod_reports_most_important_finding_and_averages() -> None:
    gpus = [
        gpu("GPU-0", b.compute_bound(), ("team-a", "p")),
        gpu("GPU-1", b.thermal_throttled(), ("team-a", "p")),
    ]
    (v,) = plan_cycle(snapshot(gpus, [pod("p", gpu_request=2)])).verdicts
    assert v.diagnosis is Diagnosis.THERMAL_THROTTLING
    assert "GPU-1" in v.reason
    assert v.activity_avg == pytest.approx(0.85)
    assert v.gpus == ("GPU-0", "GPU-1")


def test_underutilization_disabled_gives_no_diagnosis_annotation_or_event() -> None:
    spec = policy(underutilization={"enabled": False})
    plan = plan_cycle(snapshot([gpu("GPU-0", b.fake_load(), ("team-a", "p"))], [pod("p")], spec))
    (v,) = plan.verdicts
    assert v.verdict is Verdict.UNDERUTILIZED
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert names.DIAGNOSIS not in patch.annotations
    assert not [a for a in plan.actions if isinstance(a, PodEvent)]
