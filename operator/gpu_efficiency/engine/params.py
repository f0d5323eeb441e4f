"""The policy's parameters for one cycle: durations in seconds, prices by normalised model name.

The spec's durations know their seconds (``api/durations.Duration``, parsed when the spec is
validated); this one slotted object per cycle gathers what the judging, the fault rules and the
drain read, so the engine evaluates tens of thousands of GPUs from plain floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec, Mode, ReclaimWhen, UnderutilizationRule
from gpu_efficiency.engine.model import Window


def normalise_model(model: str) -> str:
    """'NVIDIA H100 80GB HBM3' and the node label 'NVIDIA-H100-80GB-HBM3' name the same price."""
    return model.strip().lower().replace(" ", "-").replace("_", "-")


@dataclass(frozen=True, slots=True)
class CycleParams:
    enforce: bool
    interval_s: float
    window_s: float
    min_coverage: float
    max_staleness_s: float
    expected_activity_samples: float  # window / scrape interval, when a sample does not say
    idle_enabled: bool
    activity_below: float
    idle_for_s: float
    warning_period_s: float
    allow_opt_out: bool
    allow_keep_until: bool
    max_keep_s: float
    under_enabled: bool
    under: UnderutilizationRule
    max_per_cycle: int
    max_per_hour: int
    max_per_namespace: int
    min_pod_age_s: float
    allow_bare_pods: bool
    priority_threshold: int
    prices: Mapping[str, float]  # normalised model -> price per GPU-hour ("default" kept)
    on_pressure: bool = False  # reclaimWhen OnPressure (engine/reclaim/pressure.py)
    scrape_interval_s: float = 0.0
    #: The fault rules' windows: the lookback, the thermal hold and recovery (quarantine/data.py).
    fault_windows_s: Mapping[Window, float] | None = None
    drain_timeout_s: float = 0.0  # faults.drainTimeout (quarantine/drain.py)


def cycle_params(spec: GPUEfficiencyPolicySpec) -> CycleParams:
    """Parse the spec once for a cycle."""
    prom = spec.metrics.prometheus
    window_s = spec.window.seconds
    scrape_s = prom.scrape_interval.seconds
    eviction = spec.eviction
    min_age = eviction.min_pod_age
    return CycleParams(
        enforce=spec.mode == Mode.ENFORCE,
        interval_s=spec.interval.seconds,
        window_s=window_s,
        min_coverage=prom.min_coverage,
        max_staleness_s=prom.max_staleness.seconds,
        expected_activity_samples=window_s / scrape_s if scrape_s > 0 else 0.0,
        idle_enabled=spec.idle.enabled,
        activity_below=spec.idle.activity_below,
        idle_for_s=spec.idle.idle_for.seconds,
        warning_period_s=spec.idle.warning_period.seconds,
        allow_opt_out=spec.idle.allow_opt_out,
        allow_keep_until=spec.idle.allow_keep_until,
        max_keep_s=spec.idle.max_keep.seconds,
        under_enabled=spec.underutilization.enabled,
        under=spec.underutilization,
        max_per_cycle=eviction.max_per_cycle,
        max_per_hour=eviction.max_per_hour,
        max_per_namespace=eviction.max_per_namespace_per_cycle,
        min_pod_age_s=min_age.seconds if min_age else window_s,
        allow_bare_pods=eviction.allow_bare_pods,
        priority_threshold=eviction.priority_threshold,
        prices={normalise_model(k): v for k, v in spec.price_per_gpu_hour.items()},
        on_pressure=spec.reclaim.reclaim_when is ReclaimWhen.ON_PRESSURE,
        scrape_interval_s=scrape_s,
        fault_windows_s={
            Window.FAULT: spec.faults.lookback.seconds,
            Window.THERMAL_HOLD: spec.faults.thermal.for_duration.seconds,
            Window.THERMAL_RECOVERY: spec.faults.thermal.recovery_after.seconds,
        },
        drain_timeout_s=spec.faults.drain_timeout.seconds,
    )
