"""Publish a settled cycle's gauges (``engine.Gauges``) on the metrics endpoint.

The engine counts; this module only maps its numbers onto the Prometheus series, and exports the
labelled counters at 0 from the first cycle so an alert's ``rate()`` sees the first increase.
"""

from __future__ import annotations

from gpu_efficiency import engine, metrics
from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.engine.outcomes import Result

#: Why samples are dropped as untrustworthy (gpu_efficiency_dropped_samples_total's reason label).
DROP_REASONS: tuple[str, ...] = tuple(engine.DropReason)
#: The owner actions counted in gpu_efficiency_reclaims_total (Evict is counted as evictions).
RECLAIM_ACTIONS = (
    ReclaimAction.SCALE_TO_ZERO,
    ReclaimAction.STOP,
    ReclaimAction.SUSPEND,
    ReclaimAction.DEACTIVATE,
)


def publish(name: str, gauges: engine.Gauges, *, queries: int, writes: int) -> None:
    """Set the policy's series from one cycle: gauges follow it, counters add what it did."""
    metrics.CYCLES.labels(name, gauges.cycle_result).inc()
    metrics.METRICS_AVAILABLE.labels(name).set(1 if gauges.metrics_available else 0)
    metrics.PROM_QUERIES.labels(name).inc(queries)
    metrics.API_WRITES.labels(name).inc(writes)
    for verdict, value in gauges.verdicts.items():
        metrics.PODS.labels(name, verdict).set(value)
    metrics.reset_labelled(metrics.DIAGNOSES, name, dict(gauges.diagnoses))
    metrics.IDLE_GPUS.labels(name).set(gauges.idle_gpus)
    metrics.IDLE_GPU_HOURS.labels(name).inc(gauges.idle_gpu_hours_added)
    for reason in DROP_REASONS:
        metrics.DROPPED_SAMPLES.labels(name, reason)
    for reason, count in gauges.dropped_samples.items():
        metrics.DROPPED_SAMPLES.labels(name, reason).inc(count)
    metrics.WASTE_PER_HOUR.labels(name).set(gauges.waste_per_hour)
    metrics.BREAKER_OPEN.labels(name).set(1 if gauges.breaker_open else 0)
    metrics.reset_labelled(metrics.TAINTED_NODES, name, dict(gauges.tainted_nodes))
    metrics.reset_groups(metrics.STRAGGLER_GPUS, name, dict(gauges.stragglers))
    metrics.reset_series(metrics.POD_EVICTION_PENDING, name, dict(gauges.pending_evictions))
    for action in RECLAIM_ACTIONS:
        for result in (Result.DONE, Result.FAILED):
            metrics.RECLAIMS.labels(name, action, result.value)
    metrics.GPU_HOURS_RETURNED.labels(name).inc(gauges.gpu_hours_returned_added)
    to_running = metrics.RECLAIM_TO_RUNNING.labels(name)
    for seconds in gauges.reclaim_to_running_s:
        to_running.observe(seconds)
    metrics.PENDING_GPU_DEMAND.labels(name).set(gauges.pending_gpu_demand)
    for result in (Result.DONE, Result.BLOCKED, Result.FAILED):
        metrics.DRAIN_EVICTIONS.labels(name, result.value)
    for result_value, count in gauges.evictions.items():
        metrics.EVICTIONS.labels(name, result_value).inc(count)
    for result_value, count in gauges.drain_evictions.items():
        metrics.DRAIN_EVICTIONS.labels(name, result_value).inc(count)
    for (owner_action, result_value), count in gauges.reclaims.items():
        metrics.RECLAIMS.labels(name, owner_action, result_value).inc(count)
