"""Plain data the engine reads (a snapshot) and writes (a plan). No I/O, no Kubernetes types.

Sources turn Prometheus or node-agent data into ``GPUSample``; handlers turn Kubernetes objects into
``PodView``/``NodeView``; the engine returns a ``Plan`` of typed actions that actuators apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec, LabelSelector, Selection
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation


class Signal(StrEnum):
    """A GPU signal, named after its dcgm-exporter field."""

    SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
    GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent 0-100, as the exporter serves it
    SM_OCCUPANCY = "DCGM_FI_PROF_SM_OCCUPANCY"
    TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
    PCIE_RX_BYTES = "DCGM_FI_PROF_PCIE_RX_BYTES"  # bytes/s
    PCIE_TX_BYTES = "DCGM_FI_PROF_PCIE_TX_BYTES"  # bytes/s
    NVLINK_RX_BYTES = "DCGM_FI_PROF_NVLINK_RX_BYTES"  # bytes/s
    NVLINK_TX_BYTES = "DCGM_FI_PROF_NVLINK_TX_BYTES"  # bytes/s
    FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
    FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
    POWER = "DCGM_FI_DEV_POWER_USAGE"  # W
    GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # C
    MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"  # C
    SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz (on in dcgm-exporter's default counters)
    CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"  # bitmask (old name ..._CLOCK_THROTTLE_REASONS)
    ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # counter
    XID = "DCGM_FI_DEV_XID_ERRORS"  # gauge holding the last XID
    REMAPPED_ROWS_UNCORRECTABLE = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
    ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
    RETIRED_PAGES_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
    PCIE_LINK_GEN = "DCGM_FI_DEV_PCIE_LINK_GEN"  # current PCIe generation (drops at idle to save power)
    PCIE_LINK_WIDTH = "DCGM_FI_DEV_PCIE_LINK_WIDTH"  # current lanes
    PCIE_MAX_LINK_GEN = "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"  # the GPU's and its slot's best generation
    PCIE_MAX_LINK_WIDTH = "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"  # the GPU's and its slot's lanes


class Window(StrEnum):
    """Which time window a ``Stats`` was aggregated over (each is a policy field)."""

    ACTIVITY = "activity"  # spec.window: idleness and diagnosis
    FAULT = "fault"  # spec.faults.lookback: counter increases, XID changes
    THERMAL_HOLD = "thermal-hold"  # spec.faults.thermal.forDuration
    THERMAL_RECOVERY = "thermal-recovery"  # spec.faults.thermal.recoveryAfter


@dataclass(frozen=True, slots=True)
class Stats:
    """Aggregates of one signal of one GPU over one window. Values may be NaN: the engine checks."""

    avg: float
    max: float
    min: float
    last: float
    count: int  # samples in the window
    last_timestamp: float  # unix seconds of the newest sample
    stddev: float = 0.0
    changes: int = 0  # times the value changed in the window (PromQL changes())
    resets: int = 0  # counter decreases in the window (PromQL resets())
    first: float | None = None  # oldest value in the window when known (for counter increases)


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    container: str = ""


@dataclass(frozen=True, slots=True)
class GPUSample:
    """Everything known about one physical GPU (or MIG device) for this cycle."""

    node: str
    uuid: str
    index: str
    model: str
    pods: tuple[PodRef, ...]
    stats: Mapping[Window, Mapping[Signal, Stats]]
    source: str = "prometheus"  # or "agent"
    expected_samples: Mapping[Window, float] = field(default_factory=dict)  # window / scrape interval
    fb_total_mib: float | None = None
    # Set when the activity window was carried from an earlier fetch (the Prometheus source's
    # tiered refresh): its Stats keep the sample times they were fetched with, and this, the GPU's
    # newest sample time now (NaN: none), is what their freshness is judged by (activity.data_bounds).
    carried_newest: float | None = None
    # The dcgm-exporter generation this GPU's series speak (api/exporter_fields.Generation; "": not
    # told, e.g. the node agent) and the fault kinds and diagnosis inputs none of whose signals its
    # exporter serves (blind is not healthy: engine/exporter_coverage.py).
    exporter: str = ""
    blind: frozenset[str] = frozenset()
    labels_seen: frozenset[str] = frozenset()  # a node-less GPU's identity labels (what to fix)
    # XID events counted (DCGM_EXP_XID_ERRORS_COUNT): duration (s) -> code -> events within it;
    # None where the exporter serves only the last-XID gauge (engine/quarantine/xid.py).
    xid_events: Mapping[int, Mapping[int, int]] | None = None
    #: The other source's reading of the same GPU when both Prometheus and its node agent report it
    #: (``engine/trust.merge_samples``): a drain or NoExecute needs both to show the fault
    #: (safety rule 9). None: one source only.
    witness: GPUSample | None = None

    def get(self, window: Window, signal: Signal) -> Stats | None:
        return self.stats.get(window, {}).get(signal)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: str  # RFC3339


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]  # gpuefficiency.io/ ones only (the sources drop the rest)
    taints: tuple[Taint, ...]
    conditions: tuple[NodeCondition, ...]
    gpu_capacity: int
    unschedulable: bool = False
    gpu_allocatable: int | None = None  # status.allocatable (what the scheduler counts); None: capacity
    #: status.addresses (InternalIP, Hostname, ...): a scrape target at one of them runs on this node.
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """An ownerReference (or the identity of an owner object): enough to find and patch it."""

    api_version: str  # "apps/v1"
    kind: str
    name: str
    uid: str = ""

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


#: (namespace, kind, name) of an owner object.
OwnerKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class OwnerObject:
    """A controller object read for owner resolution: its own controller and what actions need."""

    namespace: str
    ref: OwnerRef  # the object itself
    controller: OwnerRef | None  # its ownerReferences[controller=true]
    annotations: Mapping[str, str]  # gpuefficiency.io/ ones and kubeflow-resource-stopped
    replicas: int | None = None  # spec.replicas of scalable kinds
    suspended: bool = False  # its suspend switch is off (api/suspend_fields.py; a Workload: inactive)
    kueue_queue: str = ""  # its kueue.x-k8s.io/queue-name: Kueue owns its suspend switch
    cannot_suspend: str = ""  # why its own controller would refuse a suspend ('' when it would not)
    concurrency_policy: str = ""  # spec.concurrencyPolicy of a CronJob (Allow | Forbid | Replace)


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget: scaling or suspending an owner disrupts its pods as evicting them would."""

    namespace: str
    name: str
    selector: LabelSelector
    disruptions_allowed: int  # status.disruptionsAllowed


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]  # gpuefficiency.io/ ones only (the sources drop the rest)
    controller_kind: str | None  # ownerReferences[controller=true].kind; None for a bare pod
    priority: int
    start_time: float | None  # unix seconds; None if not started
    gpu_request: int
    is_static: bool = False  # mirror pod (kubernetes.io/config.mirror annotation)
    deleting: bool = False  # deletionTimestamp set
    controller: OwnerRef | None = None  # the controller reference itself (owner resolution)
    #: Tolerations that can match our fault taint (its key, or every key): what a drain skips.
    fault_tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str  # '' with operator Exists tolerates every taint
    operator: str  # Equal | Exists
    value: str
    effect: str  # '' matches every effect

    def tolerates(self, taint: Taint) -> bool:
        """The Kubernetes toleration rule (an empty key with Exists tolerates every taint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One matchExpressions (or matchFields, key ``metadata.name``) entry of required node affinity."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...]
    field: bool = False  # a matchFields entry: the key is a node field, not a label


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A GPU pod not yet bound to a node, with what the scheduler matches nodes by (engine/reclaim/pressure.py)."""

    namespace: str
    name: str
    uid: str
    gpu_request: int
    priority: int
    created: float | None  # metadata.creationTimestamp, unix seconds
    node_selector: Mapping[str, str]
    #: requiredDuringScheduling node affinity: any term (ORed) whose requirements all hold (ANDed).
    affinity_terms: tuple[tuple[NodeRequirement, ...], ...]
    tolerations: tuple[Toleration, ...]
    scheduled_reason: str  # the PodScheduled condition's reason when its status is False ('' otherwise)
    scheduled_message: str
    unreadable: str = ""  # why its scheduling constraints could not be read ('' when they could)


@dataclass(frozen=True, slots=True)
class NamespaceView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)  # gpuefficiency.io/ ones only


@dataclass(frozen=True, slots=True)
class SeniorPolicy:
    """A policy that takes precedence (created earlier, then by name): what it covers, this one skips."""

    name: str
    selection: Selection
    faults_enabled: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One cycle's input: everything the engine may know, and the time it may assume."""

    now: float  # unix seconds
    policy_name: str
    policy: GPUEfficiencyPolicySpec
    status: GPUEfficiencyPolicyStatus  # previous status (recent evictions, conditions)
    generation: int
    gpus: tuple[GPUSample, ...]
    pods: tuple[PodView, ...]
    nodes: tuple[NodeView, ...]
    namespaces: tuple[NamespaceView, ...]
    metrics_available: bool  # False when the source failed outright (Prometheus down)
    metrics_error: str = ""
    protected_namespaces: frozenset[str] = frozenset()  # operator's own + ALWAYS_PROTECTED + spec
    senior_policies: tuple[SeniorPolicy, ...] = ()  # overlapping policies judge each pod/node once
    #: Series or GPUs the source dropped as untrustworthy, by reason (folded into status.droppedSamples).
    dropped_samples: Mapping[str, int] = field(default_factory=dict)
    # Owner-aware reclamation (engine/reclaim/owners.py). None: no owner was read this cycle (no pod carries
    # idle-since, so nothing can be due): pods are judged one by one, as before owners existed.
    owners: Mapping[OwnerKey, OwnerObject] | None = None
    #: scaleTargetRef -> name of the HorizontalPodAutoscaler targeting it (recorded on the owner when
    #: it is scaled to zero: the HPA stops at 0 replicas and resumes once restore scales it up).
    autoscalers: Mapping[OwnerKey, str] = field(default_factory=dict)
    owners_error: str = ""  # why the owners could not be read: nothing with a controller is acted on
    disruption_budgets: tuple[DisruptionBudget, ...] = ()  # read with the owners
    pending: tuple[PendingPod, ...] = ()  # GPU pods not bound to a node (reclaimWhen OnPressure)
    #: GPUs published by DRA drivers (ResourceSlices) and our DeviceTaintRules: single-GPU quarantine.
    dra_devices: tuple[DraDevice, ...] = ()
    device_rules: tuple[DeviceRule, ...] = ()
    #: The devices ResourceClaims hold and their pods, read while a rule of ours exists; None when
    #: the read failed (a drain then waits for its timeout: who uses a device is unknown).
    device_uses: tuple[DeviceUse, ...] | None = ()


class Verdict(StrEnum):
    IDLE = "Idle"
    UNDERUTILIZED = "Underutilized"
    EFFICIENT = "Efficient"
    UNKNOWN = "Unknown"


class Diagnosis(StrEnum):
    IDLE = "idle"
    FAKE_LOAD = "fake-load"
    MEMORY_BOUND = "memory-bound"
    INPUT_STARVED = "input-starved"
    COMMUNICATION_BOUND = "communication-bound"
    LOW_OCCUPANCY = "low-occupancy"
    NO_TENSOR_CORES = "no-tensor-cores"
    THERMAL_THROTTLING = "thermal-throttling"
    MEMORY_PRESSURE = "memory-pressure"
    LOW_COMPUTE = "low-compute"
    COMPUTE_BOUND = "compute-bound"
    INSUFFICIENT_DATA = "insufficient-data"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodVerdict:
    """The engine's judgement of one pod, with the evidence a user needs to trust it."""

    namespace: str
    name: str
    verdict: Verdict
    diagnosis: Diagnosis
    recommendation: str
    activity_signal: Signal | None  # which signal the activity came from (fallback chain)
    activity_peak: float | None  # 0-1
    activity_avg: float | None  # 0-1
    gpu_util_avg: float | None  # 0-1
    efficiency: float | None  # SM activity / GPU util x 100
    gpus: tuple[str, ...]  # UUIDs
    reason: str  # one sentence: why this verdict


# ---- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnotatePod:
    """Merge-patch these annotations; a None value removes the key. Only emitted when values change."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictPod:
    namespace: str
    name: str
    uid: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainPod:
    """Evict a pod off a faulty GPU (or node) through the Eviction API before a NoExecute taint:
    the idle evictor's front door, with its own events (engine/quarantine/drain.py)."""

    namespace: str
    name: str
    uid: str
    node: str
    reason: str  # one sentence: the GPU, the node and the fault (the pod's event)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReclaimOwner:
    """Scale an owner to zero, stop or suspend it, recording the way back on it (actuators/owners.py)."""

    namespace: str
    owner: OwnerRef
    action: str  # ReclaimAction: ScaleToZero | Stop | Suspend
    pods: tuple[tuple[str, str], ...]  # (name, uid) of its GPU pods, for their events
    reason: str  # one sentence: why (written to reclaim-reason and the events)
    policy: str
    admitted: OwnerRef | None = None  # Deactivate: the job Kueue admits through this Workload (its event)
    autoscaler: str = ""  # the HorizontalPodAutoscaler targeting the owner ('' when none)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodEvent:
    namespace: str
    name: str
    uid: str
    reason: str  # CamelCase, one of api/names.py's EV_* reasons
    message: str
    type: str = "Normal"  # or "Warning"


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerEvent:
    """An event on a pod's owner object (a Job, JobSet, PyTorchJob...), where its user looks."""

    namespace: str
    owner: OwnerRef
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEvent:
    node: str
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEvent:
    reason: str
    message: str
    type: str = "Normal"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaintNode:
    node: str
    kind: str  # ecc | xid | thermal | straggler
    effect: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UntaintNode:
    node: str
    kind: str


@dataclass(frozen=True, slots=True)
class DraDevice:
    """A GPU a DRA driver publishes in a ResourceSlice: what a DeviceTaintRule selects."""

    driver: str
    pool: str
    device: str
    node: str
    uuid: str  # the GPU's UUID (the slice's ``uuid`` attribute), as the metrics name it

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    @property
    def label(self) -> str:
        """'gpu.nvidia.com/node-1/gpu-3'."""
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class DeviceRule:
    """One of our DeviceTaintRules, as read back (labelled as ours, one device each)."""

    name: str
    node: str
    kind: str  # ecc | xid | thermal
    driver: str
    pool: str
    device: str
    effect: str  # NoSchedule | NoExecute

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """A device a ResourceClaim was allocated, and the pods the claim is reserved for."""

    key: tuple[str, str, str]  # (driver, pool, device)
    pods: tuple[str, ...]  # UIDs (status.reservedFor)
    #: The allocation's tolerations that can match our fault taint (its key, or every key).
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TaintDevices:
    """Hold exactly ``devices`` of the node under our DeviceTaintRules for ``kind`` with ``effect``;
    our rules for the node and kind on any other device are removed."""

    node: str
    kind: str
    effect: str
    devices: tuple[DraDevice, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class UntaintDevices:
    """Remove every DeviceTaintRule of ours for the node and kind."""

    node: str
    kind: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNodeCondition:
    """Set a node condition of ours (GPUHealthy, GPUDegraded); the actuator keeps lastTransitionTime
    when status is unchanged."""

    node: str
    status: str
    reason: str
    message: str
    type: str = "GPUHealthy"  # api.names.GPU_HEALTHY or GPU_DEGRADED


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnotateNode:
    node: str
    annotations: Mapping[str, str | None]


Action = (
    AnnotatePod
    | EvictPod
    | DrainPod
    | ReclaimOwner
    | PodEvent
    | OwnerEvent
    | NodeEvent
    | PolicyEvent
    | TaintNode
    | UntaintNode
    | TaintDevices
    | UntaintDevices
    | SetNodeCondition
    | AnnotateNode
)


@dataclass(frozen=True, slots=True)
class StragglerGroupView:
    """One job group as the straggler pass saw it this cycle, for ``report`` and ``explain``."""

    namespace: str
    name: str  # "job/train", "label team/run=7"
    pods: tuple[str, ...]
    gpus: int
    judged: bool
    why: str  # why it was not judged ('' when judged)
    slower: tuple[str, ...] = ()  # GPUs slower than the group's median now, with the likely cause
    reported: tuple[str, ...] = ()  # of those, the ones slow for forDuration (on the pods' annotation)


@dataclass(frozen=True, slots=True)
class Plan:
    """The engine's output: actions in the order to apply them, plus what the status should say."""

    actions: tuple[Action, ...]
    verdicts: tuple[PodVerdict, ...]
    status: GPUEfficiencyPolicyStatus  # new status, before action outcomes are folded in
    notes: tuple[str, ...] = ()  # skipped-for-safety explanations, for logs and `explain`
    #: Straggling GPUs per judged job group: (namespace, group, count), 0 for a group without any.
    stragglers: tuple[tuple[str, str, int], ...] = ()
    #: Every job group the straggler pass saw (judged or not, and why).
    straggler_groups: tuple[StragglerGroupView, ...] = ()
    #: A record per planned reclamation with its actions (engine/reclaim/reclaimproof.py): folded into the
    #: status only when one of those actions is accepted.
    reclamations: tuple[tuple[tuple[Action, ...], Reclamation], ...] = ()


@dataclass(frozen=True, slots=True)
class FaultOutcome:
    """What fault quarantine decided this cycle (engine/quarantine/evaluate.py), folded into the Plan by the planner."""

    actions: tuple[Action, ...]
    quarantined: tuple[QuarantinedNodeRecord, ...]
    breaker_open: bool
    breaker_message: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QuarantinedNodeRecord:
    node: str
    kind: str
    gpus: tuple[str, ...]
    tainted: bool
    since: str  # RFC3339
