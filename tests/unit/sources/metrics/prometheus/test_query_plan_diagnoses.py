"""The Prometheus query plan fetches what the diagnosis needs.

Each simulator profile is sampled once a second, reduced exactly as the activity-window query
reduces it (only the aggregations ``QUERY_PLAN`` asks for; the rest stays NaN, as ``assemble``
leaves it), and diagnosed. A signal fetched without its coverage, freshness or range fields is
rejected by the engine as unusable, and the diagnosis silently falls back to a wrong one
(memory-bound read as fake load, thermal throttling as compute-bound, ...).
"""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.engine.model import Diagnosis, GPUSample, Window
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.reclaim.activity import data_bounds, gpu_activity
from gpu_efficiency.engine.reclaim.underutilization import diagnose
from gpu_efficiency.sources.metrics.prometheus.promql import QUERY_PLAN
from gpu_efficiency.sources.metrics.prometheus.windows import fb_total, window_stats
from gpu_efficiency_sim.gpu_models import find_model
from gpu_efficiency_sim.profiles import sample

NOW = 1_700_000_000.0
WINDOW_S = 20
MODEL = find_model("NVIDIA-H100-80GB-HBM3")
SPEC = GPUEfficiencyPolicySpec.model_validate(
    {"interval": "5s", "window": f"{WINDOW_S}s", "metrics": {"prometheus": {"scrapeInterval": "1s"}}}
)


def _aggregate(values: list[float], agg: str) -> float:
    if agg == "ts":
        return NOW - 0.5
    if agg == "count":
        return float(len(values))
    return {
        "avg": statistics.fmean,
        "max": max,
        "min": min,
        "last": lambda v: v[-1],
        "stddev": statistics.pstdev,
        "changes": lambda v: float(sum(a != b for a, b in itertools.pairwise(v))),
        "resets": lambda v: float(sum(b < a for a, b in itertools.pairwise(v))),
    }[agg](values)


def _prometheus_sample(profile: str, start: float) -> GPUSample:
    """One GPU playing ``profile`` for the window ending at start + WINDOW_S, as the source builds it."""
    readings = [sample(profile, start + t, 7, MODEL) for t in range(WINDOW_S)]
    tags: dict[str, float] = {}
    for signal, aggs in QUERY_PLAN[Window.ACTIVITY].items():
        values = [float(r[signal.value]) for r in readings if signal.value in r]
        if not values:
            continue
        for agg in aggs:
            tags[f"{signal.name}:{agg}"] = _aggregate(values, agg)
    stats = window_stats(tags)
    return GPUSample(
        node="n1",
        uuid="GPU-1",
        index="0",
        model=MODEL.product,
        pods=(),
        stats={Window.ACTIVITY: stats},
        expected_samples={Window.ACTIVITY: float(WINDOW_S)},
        fb_total_mib=fb_total(stats),
    )


@pytest.mark.parametrize(
    ("profile", "start", "expected"),
    [
        ("memory-bound", 40.0, Diagnosis.MEMORY_BOUND),
        ("communication-bound", 40.0, Diagnosis.COMMUNICATION_BOUND),
        ("input-starved", 40.0, Diagnosis.INPUT_STARVED),
        ("low-occupancy", 40.0, Diagnosis.LOW_OCCUPANCY),
        ("no-tensor-cores", 40.0, Diagnosis.NO_TENSOR_CORES),
        ("thermal-throttled", 40.0, Diagnosis.THERMAL_THROTTLING),
        ("memory-pressure", 60.0, Diagnosis.MEMORY_PRESSURE),
        ("fake-load", 40.0, Diagnosis.FAKE_LOAD),
        ("compute-bound", 40.0, Diagnosis.COMPUTE_BOUND),
    ],
)
def test_profiles_reduced_by_the_query_plan_get_their_diagnosis(
    profile: str, start: float, expected: Diagnosis
) -> None:
    gpu = _prometheus_sample(profile, start)
    params = cycle_params(SPEC)
    bounds = data_bounds(gpu, params, NOW)
    activity = gpu_activity(gpu, bounds)
    assert activity.known, activity.unknown_reason
    finding = diagnose(gpu.stats[Window.ACTIVITY], activity, params, bounds, gpu.fb_total_mib)
    assert finding.diagnosis is expected, finding.evidence


def test_every_signal_the_diagnosis_reads_is_fetched_with_coverage_and_freshness() -> None:
    """The engine trusts a signal only with count, newest timestamp, average and peak."""
    gpu = _prometheus_sample("compute-bound", 40.0)
    for signal, st in gpu.stats[Window.ACTIVITY].items():
        aggs = QUERY_PLAN[Window.ACTIVITY][signal]
        if "count" in aggs and signal.name not in ("PCIE_TX_BYTES", "MEMORY_TEMP"):  # not diagnosed
            assert math.isfinite(st.last_timestamp), f"{signal.name}: no ts in the plan"
            assert math.isfinite(st.avg), f"{signal.name}: no avg in the plan"
            assert math.isfinite(st.max), f"{signal.name}: no max in the plan"
