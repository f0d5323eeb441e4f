"""The top-level GPUEfficiencyPolicy spec: the mode, the window and one field per section, with the
checks across sections that OpenAPI cannot express.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from gpu_efficiency.api.policy.base import Duration, Model
from gpu_efficiency.api.policy.faults import FaultRules
from gpu_efficiency.api.policy.metrics import MetricsSource
from gpu_efficiency.api.policy.notify import NotifySink
from gpu_efficiency.api.policy.reclaim import EvictionBudget, IdleRule, ReclaimRule
from gpu_efficiency.api.policy.selection import Selection
from gpu_efficiency.api.policy.stragglers import StragglerRule
from gpu_efficiency.api.policy.underutilization import UnderutilizationRule


class Mode(StrEnum):
    OBSERVE = "Observe"
    ENFORCE = "Enforce"


#: The shortest cycle interval: the scheduler never runs cycles closer than this (runtime/scheduler.py).
MIN_INTERVAL_S = 1.0
#: A window holds at least this many scrapes: Prometheus range queries need several samples, and
#: one late or missed scrape must not leave too few (Grafana's $__rate_interval is at least four
#: scrape intervals for the same reason).
WINDOW_SCRAPES = 4


class GPUEfficiencyPolicySpec(Model):
    """Desired behaviour: what to watch, how to judge it and what the operator may do."""

    mode: Mode = Mode.OBSERVE
    """Observe (default) only annotates pods and emits events. Enforce also reclaims idle GPUs by
    their pod's owner (reclaim.actions): Deployments and StatefulSets are scaled to zero, Jobs and
    JobSets suspended, Kubeflow Notebooks stopped, LeaderWorkerSets and InferenceServices only get a
    recommendation, and bare pods are evicted only with eviction.allowBarePods; owners targeted by a
    HorizontalPodAutoscaler or only partly idle are never acted on, and every reclaim writes its undo
    on the owner (gpu-efficiency restore KIND/NAME -n NAMESPACE). Enforce also taints nodes with
    faulty GPUs."""
    selection: Selection = Field(default_factory=Selection)
    """Which namespaces, pods and nodes are in scope."""
    interval: Duration = Duration("60s")
    """How often the policy is evaluated."""
    window: Duration = Duration("10m")
    """Metric window: peak activity over it decides idleness, averages over it drive the diagnosis."""
    metrics: MetricsSource = Field(default_factory=MetricsSource)
    """Where metrics come from and how much data is enough."""
    idle: IdleRule = Field(default_factory=IdleRule)
    """Idle GPU reclamation."""
    underutilization: UnderutilizationRule = Field(default_factory=UnderutilizationRule)
    """Diagnosis of low-efficiency GPU use."""
    eviction: EvictionBudget = Field(default_factory=EvictionBudget)
    """Budgets and safety filters of reclamation: each owner acted on (or bare pod evicted) counts once."""
    reclaim: ReclaimRule = Field(default_factory=ReclaimRule)
    """Owner-aware reclamation: what is done to an idle pod's owner."""
    faults: FaultRules = Field(default_factory=FaultRules)
    """GPU fault quarantine."""
    stragglers: StragglerRule = Field(default_factory=StragglerRule)
    """Stragglers: the slow GPU that holds back a whole multi-GPU job."""
    price_per_gpu_hour: dict[str, float] = Field(default_factory=dict, max_length=64)
    """Cost of one GPU-hour by GPU model (the nvidia.com/gpu.product label or DCGM modelName); key "default" for the rest."""
    notify: list[NotifySink] = Field(default_factory=list, max_length=16)
    """Where warnings and actions are posted (webhooks), besides Kubernetes events; names must be unique."""

    @model_validator(mode="after")
    def _check_cross_fields(self) -> GPUEfficiencyPolicySpec:
        """Constraints OpenAPI cannot express; mirrored as CEL rules in the CRD where possible."""

        if self.interval.seconds < MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S:.0f}s (cycles are never closer)")
        if self.window.seconds < self.interval.seconds:
            raise ValueError("window must be at least interval")
        prom = self.metrics.prometheus
        scrape_s = prom.scrape_interval.seconds
        if scrape_s <= 0:
            raise ValueError("metrics.prometheus.scrapeInterval must be longer than 0s")
        if self.window.seconds < WINDOW_SCRAPES * scrape_s:
            raise ValueError(
                f"window must be at least {WINDOW_SCRAPES} x metrics.prometheus.scrapeInterval "
                "(fewer samples make every GPU Unknown)"
            )
        if prom.max_staleness.seconds < scrape_s:
            raise ValueError("metrics.prometheus.maxStaleness must be at least scrapeInterval")
        if prom.query_timeout.seconds <= 0:
            raise ValueError("metrics.prometheus.queryTimeout must be longer than 0s")
        if self.mode == Mode.ENFORCE and self.idle.enabled and self.idle.warning_period.seconds <= 0:
            raise ValueError(
                "idle.warningPeriod must be longer than 0s in Enforce (a warning before every reclaim)"
            )
        u = self.underutilization
        if u.no_tensor_sm_active_min > u.no_tensor_sm_active_max:
            raise ValueError("underutilization.noTensorSmActiveMin must not exceed noTensorSmActiveMax")
        if any(v < 0 for v in self.price_per_gpu_hour.values()):
            raise ValueError("pricePerGpuHour values must be non-negative")
        sink_names = [sink.name for sink in self.notify]
        if len(set(sink_names)) != len(sink_names):
            raise ValueError(f"notify: sink names must be unique, got {sink_names}")
        overlap = set(self.faults.xid.critical) & set(self.faults.xid.ignored)
        if overlap:
            raise ValueError(f"faults.xid codes both critical and ignored: {sorted(overlap)}")
        return self
