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
    "Eviction attempts by result (done, blocked, skipped, failed).",
    ["policy", "result"],
    registry=REGISTRY,
)
RECLAIMS = Counter(
    "gpu_efficiency_reclaims",
    "Owner reclaim attempts by action (ScaleToZero, Stop, Suspend) and result (done, skipped, failed).",
    ["policy", "action", "result"],
    registry=REGISTRY,
)
IDLE_GPU_HOURS = Counter(
    "gpu_efficiency_idle_gpu_hours", "GPU-hours observed idle.", ["policy"], registry=REGISTRY
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
TAINTED_NODES = Gauge(
    "gpu_efficiency_tainted_nodes", "Nodes held tainted by kind.", ["policy", "kind"], registry=REGISTRY
)
PROM_QUERIES = Counter(
    "gpu_efficiency_prometheus_queries", "PromQL queries issued.", ["policy"], registry=REGISTRY
)
API_WRITES = Counter(
    "gpu_efficiency_api_writes", "Kubernetes API writes made.", ["policy"], registry=REGISTRY
)
LEADER = Gauge("gpu_efficiency_leader", "1 while this replica holds the leader lease.", registry=REGISTRY)

# The watch-based cache of pods, nodes and namespaces (sources/watch.py), labelled by resource.
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
