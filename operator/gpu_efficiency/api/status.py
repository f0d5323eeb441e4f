"""Pydantic model of the GPUEfficiencyPolicy status subresource (written by the operator only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True)


class Condition(StatusModel):
    """A standard Kubernetes condition."""

    type: str
    """Ready, MetricsAvailable, CircuitBreakerOpen, PolicyValid or Shadowed."""
    status: str
    """True, False or Unknown."""
    reason: str = ""
    """CamelCase reason."""
    message: str = ""
    """Human readable detail."""
    last_transition_time: str = ""
    """When status last changed (RFC3339); unchanged while the status holds."""
    observed_generation: int = 0
    """The spec generation this condition was computed from."""


class VerdictCounts(StatusModel):
    """Pods by verdict in the last cycle."""

    idle: int = 0
    """Pods whose GPUs were idle."""
    underutilized: int = 0
    """Pods with a low-efficiency diagnosis."""
    efficient: int = 0
    """Compute-bound pods."""
    unknown: int = 0
    """Pods without enough data for a verdict."""


class QuarantinedNode(StatusModel):
    """A node this policy holds faulted."""

    node: str
    """Node name."""
    kind: str
    """Fault kind: ecc, xid, thermal or straggler."""
    gpus: list[str] = Field(default_factory=list)
    """GPU indexes/UUIDs at fault."""
    tainted: bool = False
    """Whether the taint is set (Enforce mode and breaker closed)."""
    since: str = ""
    """When the fault was first detected (RFC3339)."""


class PendingGpuDemand(StatusModel):
    """GPU pods Pending as unschedulable for lack of nvidia.com/gpu in the last cycle (cluster-wide)."""

    pods: int = 0
    """Pods waiting."""
    gpus: int = 0
    """GPUs they request."""


class Reclamation(StatusModel):
    """One reclamation by this policy, kept to prove its GPUs were returned and used."""

    owner: str
    """NAMESPACE/KIND/NAME of the reclaimed owner (the pod itself when bare)."""
    uid: str = ""
    """metadata.uid of that owner as read when it was reclaimed: the proof that this operator
    reclaimed it (an annotation on the owner alone proves nothing; its user can write one)."""
    replicas: int | None = None
    """Its replicas before it was scaled to zero: the most ``gpu-efficiency restore`` brings back."""
    action: str
    """ScaleToZero, Stop, Suspend or Evict."""
    time: str
    """When the action was accepted (RFC3339)."""
    nodes: list[str] = Field(default_factory=list)
    """Nodes whose GPUs it freed."""
    gpus: int = 0
    """GPUs it freed (pods time-sliced on one GPU count it once)."""
    gpu_ids: list[str] = Field(default_factory=list)
    """UUIDs of those GPUs when every pod's are known: a GPU shared by pods reclaimed apart (two
    bare pods time-sliced on it) counts once in GPU-hours returned."""
    controllers: list[str] = Field(default_factory=list)
    """KIND/NAME of its pods' controllers (the pods for a bare pod): a new pod of one means it is back."""
    waiting_pods: list[str] = Field(default_factory=list)
    """NAMESPACE/NAME of GPU pods Pending as unschedulable when it was reclaimed (under OnPressure:
    those it was reclaimed for), at most 8."""
    returned: bool = True
    """True while it stays reclaimed (GPU-hours are counted); False once its pods or owner are back."""
    gpu_hours_returned: float = 0.0
    """GPUs x hours it has stayed reclaimed, counted each cycle."""
    running_pod: str = ""
    """The first waiting pod seen Running on one of its nodes."""
    seconds_to_running: float | None = None
    """From the action to that pod's start (status.startTime)."""


class OwnerHold(StatusModel):
    """An owner this policy leaves alone for a while after reclaiming it did not hold."""

    owner: str
    """NAMESPACE/KIND/NAME of the owner (for a pod whose controller cannot be acted on: that controller)."""
    reason: str
    """ReclaimReverted (scaled back without restore, e.g. by a GitOps tool) or ReclaimIneffective
    (its evicted pods came back and went idle again)."""
    reclaimed_at: str
    """Time of the reclamation that did not hold (the status.reclamations record): reported once."""
    since: str
    """When it was seen (RFC3339)."""
    until: str
    """The owner is not reclaimed again before this (RFC3339); remove the entry to retry sooner."""
    count: int = 1
    """How many times in a row: a ReclaimReverted back-off doubles with each."""


class GPUEfficiencyPolicyStatus(StatusModel):
    """What the operator observed and did in its last cycles."""

    observed_generation: int = 0
    """The spec generation the last cycle used."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, MetricsAvailable, CircuitBreakerOpen, PolicyValid, Shadowed."""
    last_evaluation_time: str = ""
    """End of the last evaluation cycle (RFC3339)."""
    gpus_evaluated: int = 0
    """GPUs in scope in the last cycle."""
    pods_evaluated: int = 0
    """GPU pods in scope in the last cycle."""
    verdicts: VerdictCounts = Field(default_factory=VerdictCounts)
    """Pods by verdict in the last cycle."""
    idle_gpus: int = 0
    """GPUs idle in the last cycle."""
    warned_pods: int = 0
    """Pods currently carrying an evict-after warning."""
    evictions_total: int = 0
    """Evictions done by this policy since it was created."""
    evictions_blocked_total: int = 0
    """Evictions refused (PodDisruptionBudget) since the policy was created."""
    reclaims_total: int = 0
    """Owners reclaimed (scaled to zero, stopped or suspended) by this policy since it was created."""
    reclaims_reverted_total: int = 0
    """Reclaimed owners scaled or resumed back without gpu-efficiency restore (ReclaimReverted)."""
    reclaims_ineffective_total: int = 0
    """Evictions whose pods came back under the same owner and went idle again (ReclaimIneffective)."""
    owner_holds: list[OwnerHold] = Field(default_factory=list)
    """Owners left alone after a ReclaimReverted (back-off) or ReclaimIneffective, until their time."""
    recent_evictions: list[str] = Field(default_factory=list)
    """Times (RFC3339) of the evictions and reclaims in the last hour: the per-hour budget survives
    restarts."""
    idle_gpu_hours: float = 0.0
    """GPU-hours spent idle, accumulated over cycles."""
    estimated_waste_per_hour: float = 0.0
    """Cost per hour of the GPUs idle now, from pricePerGpuHour."""
    estimated_waste_total: float = 0.0
    """Accumulated cost of idle GPU-hours."""
    quarantined_nodes: list[QuarantinedNode] = Field(default_factory=list)
    """Nodes held faulted by this policy."""
    pending_gpu_demand: PendingGpuDemand = Field(default_factory=PendingGpuDemand)
    """GPU pods Pending as unschedulable for lack of GPUs in the last cycle, and the GPUs they request."""
    gpu_hours_returned: float = 0.0
    """GPU-hours given back by reclamations: each cycle adds, for every reclamation still in force
    (no pod of its controllers back, owner not restored), its GPUs times the time since the previous
    cycle (at most two intervals). A lower bound: only the last reclamations listed are counted."""
    reclamations: list[Reclamation] = Field(default_factory=list)
    """The reclamations still in force (at most 500) and the last 10 that ended, newest last: what
    was freed, for which waiting pods, and how long until the first of them ran there. A record in
    force is what ``restore`` and the engine believe an owner was reclaimed by."""
    dropped_samples: dict[str, int] = Field(default_factory=dict)
    """Metric series or GPUs dropped as untrustworthy in the last cycle, by reason:
    invalid-gpu-id, node-conflict (one GPU on two nodes), pod-node-mismatch (a pod label on a GPU
    of another node than the pod's), gpus-exceed-capacity (a node reporting more GPUs than it has:
    its fault windows are not believed), contradicts-agent (a Prometheus reading below what the
    node agent's busy reading of the same GPU implies: the agent's is used), identity-off-node (a
    scrape target naming a GPU of another node than its own), fault-off-target (a fault series of a
    GPU from a target that does not report that GPU on its node)."""
    exporter_generations: dict[str, int] = Field(default_factory=dict)
    """GPUs by the dcgm-exporter generation their series speak, in the last cycle: legacy
    (CLOCK_THROTTLE_REASONS, Hostname), 4.x (to 4.8.2), 4.8.3+ (hostname, DCGM_EXP_* counters),
    4.9+ (DCGM 4.6+ names and units), default-csv (no profiling fields, no ECC counters), unknown."""
    blind_gpus: dict[str, int] = Field(default_factory=dict)
    """GPUs whose exporter serves none of the signals of a fault kind (ecc, xid, thermal, pcie,
    rowremap) or diagnosis input, in the last cycle: unknown for them, never healthy (the
    SignalsComplete condition)."""
