"""The operator's own Prometheus metrics (names are part of the public API: alerts use them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

CYCLES = Counter(
    "gpu_efficiency_cycles",
    "Evaluation cycles by result (ok, metrics_unavailable, invalid, error).",
    ["policy", "result"],
    registry=REGISTRY,
)
CYCLE_SECONDS = Histogram(
    "gpu_efficiency_cycle_duration_seconds",
    "Wall time of one evaluation cycle.",
    ["policy"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    registry=REGISTRY,
)
PODS = Gauge(
    "gpu_efficiency_pods",
    "GPU pods in scope by verdict in the last cycle.",
    ["policy", "verdict"],
    registry=REGISTRY,
)
DIAGNOSES = Gauge(
    "gpu_efficiency_diagnoses",
    "GPU pods by diagnosis in the last cycle.",
    ["policy", "diagnosis"],
    registry=REGISTRY,
)
IDLE_GPUS = Gauge("gpu_efficiency_idle_gpus", "GPUs idle in the last cycle.", ["policy"], registry=REGISTRY)
EVICTIONS = Counter(
    "gpu_efficiency_evictions",
    "Eviction attempts by result (done, blocked, skipped, failed, unknown: answered 5xx or timed out and the re-read could not tell; counted as done).",
    ["policy", "result"],
    registry=REGISTRY,
)
DROPPED_SAMPLES = Counter(
    "gpu_efficiency_dropped_samples",
    "Metric series or GPUs dropped as untrustworthy, by reason (see status.droppedSamples).",
    ["policy", "reason"],
    registry=REGISTRY,
)
RECLAIMS = Counter(
    "gpu_efficiency_reclaims",
    "Owner reclaim attempts by action (ScaleToZero, Stop, Suspend) and result (done, skipped, failed, unknown: counted as done).",
    ["policy", "action", "result"],
    registry=REGISTRY,
)
SELF_SERVICE_CLICKS = Counter(
    "gpu_efficiency_selfservice_clicks",
    "Self-service clicks (page or Slack) by action (keep, release), channel (page, slack) and result "
    "(done, unchanged, refused, standby, failed).",
    ["action", "via", "result"],
    registry=REGISTRY,
)
for _action in ("keep", "release"):  # zero from the start, so rate() and alerts see the first click
    for _via in ("page", "slack"):
        for _result in ("done", "unchanged", "refused", "standby", "failed"):
            SELF_SERVICE_CLICKS.labels(_action, _via, _result)
IDLE_GPU_HOURS = Counter(
    "gpu_efficiency_idle_gpu_hours",
    "GPU-hours spent idle: each cycle adds its idle GPUs times the time since the previous cycle "
    "(at most two intervals), as status.idleGpuHours does.",
    ["policy"],
    registry=REGISTRY,
)
GPU_HOURS_RETURNED = Counter(
    "gpu_efficiency_gpu_hours_returned",
    "GPU-hours given back by reclamations: each cycle adds the GPUs of every reclamation still in "
    "force times the time since the previous cycle (at most two intervals), as status.gpuHoursReturned does.",
    ["policy"],
    registry=REGISTRY,
)
RECLAIM_TO_RUNNING = Histogram(
    "gpu_efficiency_reclaim_to_running_seconds",
    "Per reclamation, from the action to the start of the first pod that was waiting for GPUs and "
    "runs on a freed node (status.reclamations[].secondsToRunning).",
    ["policy"],
    buckets=(5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
PENDING_GPU_DEMAND = Gauge(
    "gpu_efficiency_pending_gpu_demand",
    "GPUs requested by pods Pending as unschedulable for lack of nvidia.com/gpu (status.pendingGpuDemand).",
    ["policy"],
    registry=REGISTRY,
)
WASTE_PER_HOUR = Gauge(
    "gpu_efficiency_estimated_waste_per_hour",
    "Cost per hour of the GPUs idle now.",
    ["policy"],
    registry=REGISTRY,
)
METRICS_AVAILABLE = Gauge(
    "gpu_efficiency_metrics_available",
    "1 when the last cycle had metrics, else 0.",
    ["policy"],
    registry=REGISTRY,
)
BREAKER_OPEN = Gauge(
    "gpu_efficiency_circuit_breaker_open",
    "1 while the fault circuit breaker is open.",
    ["policy"],
    registry=REGISTRY,
)
DRAIN_EVICTIONS = Counter(
    "gpu_efficiency_fault_drain_evictions",
    "Evictions of pods off a faulty GPU or node before a NoExecute fault taint, by result "
    "(done, blocked: refused by a PodDisruptionBudget and retried, skipped, failed).",
    ["policy", "result"],
    registry=REGISTRY,
)
TAINTED_NODES = Gauge(
    "gpu_efficiency_tainted_nodes", "Nodes held tainted by kind.", ["policy", "kind"], registry=REGISTRY
)
STRAGGLER_GPUS = Gauge(
    "gpu_efficiency_straggler_gpus",
    "Straggling GPUs reported per judged job group (0: judged, none slow).",
    ["policy", "namespace", "group"],
    registry=REGISTRY,
)
PROM_QUERIES = Counter(
    "gpu_efficiency_prometheus_queries", "PromQL queries issued.", ["policy"], registry=REGISTRY
)
API_WRITES = Counter(
    "gpu_efficiency_api_writes", "Kubernetes API writes made.", ["policy"], registry=REGISTRY
)
EVENTS_FAILED = Counter(
    "gpu_efficiency_events_failed",
    "Follow-up events (after an eviction) the API refused; the action itself stands.",
    ["reason"],
    registry=REGISTRY,
)
STATUS_WRITES_FAILED = Counter(
    "gpu_efficiency_status_writes_failed",
    "Policy status writes that failed; the status is kept in memory and written next cycle.",
    ["policy"],
    registry=REGISTRY,
)
NOTIFICATIONS = Counter(
    "gpu_efficiency_notifications",
    "Notifications to the policy's sinks (spec.notify) by result: sent, failed (after every retry), "
    "dropped (the sink's queue was full) and retried (attempts that failed and were retried).",
    ["policy", "sink", "result"],
    registry=REGISTRY,
)
POD_EVICTION_PENDING = Gauge(
    "gpu_efficiency_pod_eviction_pending",
    "Unix time at which a warned idle pod's GPU is reclaimed unless it works again or is kept "
    "(gpuefficiency.io/keep-for); the series goes when the warning ends.",
    ["policy", "namespace", "pod", "owner", "deadline"],
    registry=REGISTRY,
)
LAST_CYCLE = Gauge(
    "gpu_efficiency_last_cycle_timestamp_seconds",
    "Unix time this replica last completed a cycle of the policy (as leader; invalid specs count).",
    ["policy"],
    registry=REGISTRY,
)
POLICIES = Gauge(
    "gpu_efficiency_policies", "Policies the scheduler runs (seen by this replica).", registry=REGISTRY
)
FAULT_WAKES = Counter(
    "gpu_efficiency_fault_wakes",
    "Early fault cycles a node agent's GPUHealthy=False asked for, by outcome (requested; coalesced "
    "into one already pending; ran).",
    ["policy", "outcome"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "gpu_efficiency_leader",
    "1 while this replica holds the leader lease (and acts), 0 on a standby replica.",
    registry=REGISTRY,
)

#: Per-policy gauges: what the leader saw in its last cycle. A standby exports none of them.
POLICY_GAUGES: tuple[Gauge, ...] = (
    PODS,
    DIAGNOSES,
    IDLE_GPUS,
    WASTE_PER_HOUR,
    METRICS_AVAILABLE,
    BREAKER_OPEN,
    TAINTED_NODES,
    STRAGGLER_GPUS,
    PENDING_GPU_DEMAND,
    POD_EVICTION_PENDING,
)
#: Every per-policy series (label ``policy`` first): dropped with the policy.
POLICY_METRICS: tuple[Counter | Gauge | Histogram, ...] = (
    CYCLES,
    CYCLE_SECONDS,
    EVICTIONS,
    DRAIN_EVICTIONS,
    IDLE_GPU_HOURS,
    PROM_QUERIES,
    API_WRITES,
    STATUS_WRITES_FAILED,
    DROPPED_SAMPLES,
    RECLAIMS,
    GPU_HOURS_RETURNED,
    RECLAIM_TO_RUNNING,
    NOTIFICATIONS,
    LAST_CYCLE,
    FAULT_WAKES,
    *POLICY_GAUGES,
)


def _policy_label_sets(metric: Counter | Gauge | Histogram, policy: str | None) -> set[tuple[str, ...]]:
    """The label values of ``metric``'s children for ``policy`` (every policy when None)."""
    label_sets = set()
    for family in metric.collect():
        for sample in family.samples:
            labels = sample.labels
            if "policy" in labels and (policy is None or labels["policy"] == policy):
                label_sets.add(tuple(labels[n] for n in metric._labelnames))
    return label_sets


def forget_policy(policy: str) -> None:
    """Drop every series of a deleted policy, so no alert fires for a policy that is gone."""
    for metric in POLICY_METRICS:
        for labels in _policy_label_sets(metric, policy):
            metric.remove(*labels)


def forget_policy_gauges(policy: str) -> None:
    """Drop one policy's gauges (its spec turned invalid: it judges nothing now)."""
    for gauge in POLICY_GAUGES:
        for labels in _policy_label_sets(gauge, policy):
            gauge.remove(*labels)


def clear_policy_gauges() -> None:
    """Drop every policy's gauges: this replica stopped acting, so what it saw is no longer current."""
    for gauge in POLICY_GAUGES:
        gauge.clear()


def reset_labelled(gauge: Gauge, policy: str, values: dict[str, int]) -> None:
    """Set ``gauge{policy, <second label>}`` to exactly ``values``: labels absent from it are removed,
    so a diagnosis or fault kind that is gone stops being exported."""
    for labels in _policy_label_sets(gauge, policy):
        if labels[1] not in values:
            gauge.remove(*labels)
    for value_label, value in values.items():
        gauge.labels(policy, value_label).set(value)


def reset_series(gauge: Gauge, policy: str, values: dict[tuple[str, ...], float]) -> None:
    """Set ``gauge{policy, *labels}`` to exactly ``values`` (keyed by the labels after ``policy``):
    series absent from it are removed, so a warning that ended stops being exported."""
    for labels in _policy_label_sets(gauge, policy):
        if labels[1:] not in values:
            gauge.remove(*labels)
    for labels, value in values.items():
        gauge.labels(policy, *labels).set(value)


# The watch-based cache of pods, nodes and namespaces (sources/kube/watch.py), labelled by resource.
def reset_groups(gauge: Gauge, policy: str, values: dict[tuple[str, str], int]) -> None:
    """Set ``gauge{policy, namespace, group}`` to exactly ``values``: a group no longer judged goes."""
    for labels in _policy_label_sets(gauge, policy):
        if (labels[1], labels[2]) not in values:
            gauge.remove(*labels)
    for (namespace, group), value in values.items():
        gauge.labels(policy, namespace, group).set(value)


CACHE_EVENTS = Counter(
    "gpu_efficiency_cache_events",
    "Watch events applied to the cluster cache by resource and type (ADDED, MODIFIED, DELETED, BOOKMARK).",
    ["resource", "type"],
    registry=REGISTRY,
)
CACHE_RELISTS = Counter(
    "gpu_efficiency_cache_relists",
    "Full LISTs that filled the cluster cache by resource and reason (start, expired, silent, error).",
    ["resource", "reason"],
    registry=REGISTRY,
)
CACHE_WATCH_RESTARTS = Counter(
    "gpu_efficiency_cache_watch_restarts",
    "Watches of the cluster cache started again by resource and reason (ended: the server's timeout; "
    "expired: 410; silent: no bookmark for too long; error: retried with backoff).",
    ["resource", "reason"],
    registry=REGISTRY,
)
CACHE_SYNCED = Gauge(
    "gpu_efficiency_cache_synced",
    "1 while cycles read this resource from the cache (synced, watch healthy), 0 while they LIST it.",
    ["resource"],
    registry=REGISTRY,
)
CACHE_OBJECTS = Gauge(
    "gpu_efficiency_cache_objects", "Objects held in the cluster cache.", ["resource"], registry=REGISTRY
)
CACHE_FALLBACKS = Counter(
    "gpu_efficiency_cache_fallback_lists",
    "Cycle reads that LISTed a resource because its cache was not usable.",
    ["resource"],
    registry=REGISTRY,
)


def serve(port: int) -> None:
    if port:
        start_http_server(port, registry=REGISTRY)
