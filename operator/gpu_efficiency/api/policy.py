"""Pydantic models of the GPUEfficiencyPolicy spec: the single source of the CRD schema.

Field docstrings become CRD descriptions (see ``api/crd.py``), so they are written for cluster
admins reading ``kubectl explain gep.spec``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "gpuefficiency.io"
VERSION = "v1alpha1"
KIND = "GPUEfficiencyPolicy"
PLURAL = "gpuefficiencypolicies"
SINGULAR = "gpuefficiencypolicy"
SHORT_NAMES = ("gep",)
PREFIX = f"{GROUP}/"

#: Namespaces the operator never touches, whatever a policy says.
ALWAYS_PROTECTED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

#: The form of every duration field; the CRD generator appends ``DURATION_NOTE`` to each such
#: field's own description (a description here would replace the field's docstring).
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DURATION_NOTE = "A Go-style duration such as 30s, 5m or 1h30m."
Duration = Annotated[str, Field(pattern=DURATION_PATTERN)]


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )


class Mode(StrEnum):
    OBSERVE = "Observe"
    ENFORCE = "Enforce"


class LabelSelectorRequirement(Model):
    key: str
    """The label key the selector applies to."""
    operator: str = Field(pattern=r"^(In|NotIn|Exists|DoesNotExist)$")
    """In, NotIn, Exists or DoesNotExist."""
    values: list[str] = Field(default_factory=list)
    """Values for In and NotIn; empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        """Kubernetes' own rule for selectors, which OpenAPI cannot express (reported in status)."""
        needs_values = self.operator in ("In", "NotIn")
        if needs_values and not self.values:
            raise ValueError(f"matchExpressions: operator {self.operator} on key {self.key!r} needs values")
        if not needs_values and self.values:
            raise ValueError(
                f"matchExpressions: operator {self.operator} on key {self.key!r} takes no values"
            )
        return self


class LabelSelector(Model):
    """A Kubernetes label selector; an empty selector matches everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels that must all be present with these values."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)
    """Set-based requirements that must all hold."""


class Selection(Model):
    """Which pods and nodes the policy looks at."""

    namespace_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Namespaces whose labels match are in scope (empty: all namespaces)."""
    pod_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Pods whose labels match are in scope (empty: all pods requesting GPUs)."""
    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Nodes whose labels match are in scope, for pods and faults (empty: all GPU nodes)."""
    excluded_namespaces: list[str] = Field(default_factory=list, max_length=256)
    """Namespaces never touched, on top of kube-system, kube-public, kube-node-lease and the operator's own."""


#: An http(s) base URL without user info, query or fragment (or empty: the operator's own).
PROMETHEUS_URL_PATTERN = (
    r"^$|^https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~!$'()*+,;=:@%/\-]*)?$"
)


class PrometheusSource(Model):
    """Where DCGM metrics are read from. Credentials come from the operator's flags/environment."""

    url: str | None = Field(default=None, max_length=2048, pattern=PROMETHEUS_URL_PATTERN)
    """http(s) base URL of Prometheus; empty: --prometheus-url. Credentials only go where allowed."""
    scrape_interval: Duration = "15s"
    """The scrape interval of the DCGM metrics, used to judge how many samples a window should hold."""
    min_coverage: float = Field(default=0.6, ge=0.05, le=1.0)
    """Fraction of the expected samples a GPU must have in the window; fewer gives the verdict Unknown."""
    max_staleness: Duration = "2m"
    """A GPU whose newest sample is older than this gets the verdict Unknown."""
    query_timeout: Duration = "10s"
    """Timeout of one PromQL query."""


class MetricsSource(Model):
    """Metric sources and how much data is enough."""

    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    """Prometheus holding dcgm-exporter or node-agent metrics."""
    node_agent: bool = False
    """Also read the operator's node agents directly (faster fault detection, true activity without DCGM)."""


class IdleRule(Model):
    """Idle GPU reclamation: idle-since, then a warning with evict-after, then eviction (Enforce only)."""

    enabled: bool = True
    """Detect idle GPUs at all."""
    activity_below: float = Field(default=0.01, ge=0.0, le=1.0)
    """A GPU is idle when its peak activity (SM active, else GR engine active, else GPU util) over the window is below this."""
    idle_for: Duration = "30m"
    """How long a pod must stay idle before it is warned."""
    warning_period: Duration = "15m"
    """Time between the warning (evict-after annotation and event) and the eviction."""
    allow_opt_out: bool = False
    """Honour the pod annotation gpuefficiency.io/exempt=true."""
    allow_keep_until: bool = True
    """Honour the pod acknowledgements gpuefficiency.io/keep-for=<duration> and keep-until=<RFC3339>, bounded by maxKeep."""
    max_keep: Duration = "24h"
    """Longest an acknowledgement (keep-for, keep-until) may postpone eviction, counted from when it was first seen."""


class UnderutilizationRule(Model):
    """Diagnosis of GPUs that are busy on paper but do little work. Thresholds are fractions 0-1."""

    enabled: bool = True
    """Diagnose underutilization and annotate pods with a diagnosis and a recommendation."""
    low_activity_below: float = Field(default=0.3, ge=0.0, le=1.0)
    """SM activity below this is low compute (the common condition of most diagnoses)."""
    fake_load_gpu_util_above: float = Field(default=0.8, ge=0.0, le=1.0)
    """GPU_UTIL at or above this with low SM activity is fake load."""
    memory_bound_dram_above: float = Field(default=0.8, ge=0.0, le=1.0)
    """DRAM activity above this with low SM activity is memory-bound."""
    input_starved_pcie_rx_bytes_per_second: float = Field(default=1.0e9, ge=0.0)
    """PCIe RX peak above this (bytes/s) with low SM activity and oscillating utilisation is input-starved."""
    oscillation_stddev_above: float = Field(default=0.15, ge=0.0, le=1.0)
    """Standard deviation of GPU_UTIL (0-1) above which utilisation counts as oscillating."""
    communication_bytes_per_second: float = Field(default=5.0e9, ge=0.0)
    """NVLink or network traffic above this (bytes/s) with low SM activity is communication-bound."""
    low_occupancy_sm_active_above: float = Field(default=0.5, ge=0.0, le=1.0)
    """SM activity above this with occupancy below lowOccupancyBelow is low occupancy (batch too small)."""
    low_occupancy_below: float = Field(default=0.2, ge=0.0, le=1.0)
    """SM occupancy below this (with high SM activity) is low occupancy."""
    no_tensor_sm_active_min: float = Field(default=0.3, ge=0.0, le=1.0)
    """Lower bound of SM activity for the no-tensor-cores diagnosis."""
    no_tensor_sm_active_max: float = Field(default=0.7, ge=0.0, le=1.0)
    """Upper bound of SM activity for the no-tensor-cores diagnosis."""
    no_tensor_tensor_below: float = Field(default=0.01, ge=0.0, le=1.0)
    """Tensor pipe activity below this counts as no tensor cores."""
    temperature_limit_celsius: float = Field(default=87.0, ge=0.0, le=150.0)
    """GPU temperature above this counts as thermal throttling for the diagnosis."""
    memory_pressure_fraction: float = Field(default=0.95, ge=0.0, le=1.0)
    """Framebuffer use at or above this fraction of the total is memory pressure."""
    efficient_sm_active_above: float = Field(default=0.5, ge=0.0, le=1.0)
    """SM activity at or above this with no other finding is compute-bound (efficient)."""


class EvictionBudget(Model):
    """Caps that bound the damage of any mistake."""

    max_per_cycle: int = Field(default=5, ge=0, le=10000)
    """Most reclaims (an owner scaled, stopped or suspended, or a pod evicted) in one evaluation cycle."""
    max_per_hour: int = Field(default=20, ge=0, le=100000)
    """Most reclaims in any rolling hour, across restarts (kept in status)."""
    max_per_namespace_per_cycle: int = Field(default=2, ge=0, le=10000)
    """Most reclaims in one namespace in one cycle."""
    min_pod_age: Duration | None = None
    """Pods younger than this are never evicted; default: the metric window (warm-up)."""
    allow_bare_pods: bool = False
    """Evict pods without a controller (nothing recreates them). Off by default."""
    priority_threshold: int = Field(default=1_000_000_000, ge=-2147483648, le=2147483647)
    """Pods with priority at or above this (system-critical: 2000000000) are never evicted."""


class ReclaimAction(StrEnum):
    """What reclaiming an idle owner does (DESIGN.md safety rule 8)."""

    SCALE_TO_ZERO = "ScaleToZero"  # replicas 0 through the /scale subresource
    STOP = "Stop"  # Kubeflow Notebook: the kubeflow-resource-stopped annotation
    SUSPEND = "Suspend"  # Job, JobSet: spec.suspend=true
    EVICT = "Evict"  # the pods through the Eviction API (nothing recreates a bare pod)
    RECOMMEND = "Recommend"  # annotate and emit only


class OwnerActions(Model):
    """The action per owner kind. Owners of other kinds, owners targeted by a HorizontalPodAutoscaler
    and owners only partly idle are never acted on: their pods get a recommendation instead."""

    deployment: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SCALE_TO_ZERO, alias="Deployment"
    )
    """Deployments (apps/v1, through their ReplicaSet): scaled to zero through deployments/scale."""
    stateful_set: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SCALE_TO_ZERO, alias="StatefulSet"
    )
    """StatefulSets (apps/v1) not owned by another controller: scaled to zero through statefulsets/scale."""
    job: Literal[ReclaimAction.SUSPEND, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="Job"
    )
    """Jobs (batch/v1) not owned by another controller: suspended (spec.suspend=true; not failed)."""
    job_set: Literal[ReclaimAction.SUSPEND, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.SUSPEND, alias="JobSet"
    )
    """JobSets (jobset.x-k8s.io): suspended (spec.suspend=true)."""
    leader_worker_set: Literal[ReclaimAction.SCALE_TO_ZERO, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = (
        Field(default=ReclaimAction.RECOMMEND, alias="LeaderWorkerSet")
    )
    """LeaderWorkerSets (leaderworkerset.x-k8s.io): recommend by default; ScaleToZero uses leaderworkersets/scale."""
    notebook: Literal[ReclaimAction.STOP, ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.STOP, alias="Notebook"
    )
    """Kubeflow Notebooks (kubeflow.org/v1): stopped with the kubeflow-resource-stopped annotation."""
    inference_service: Literal[ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.RECOMMEND, alias="InferenceService"
    )
    """KServe InferenceServices (serving.kserve.io): recommend by default (their autoscaler owns replicas)."""
    pod: Literal[ReclaimAction.EVICT, ReclaimAction.RECOMMEND] = Field(
        default=ReclaimAction.EVICT, alias="Pod"
    )
    """Bare pods: evicted, and only when eviction.allowBarePods is true."""

    def for_kind(self, kind: str) -> ReclaimAction:
        """The action for an owner kind; Recommend for kinds without an integration."""
        chosen: dict[str, ReclaimAction] = {
            "Deployment": self.deployment,
            "StatefulSet": self.stateful_set,
            "Job": self.job,
            "JobSet": self.job_set,
            "LeaderWorkerSet": self.leader_worker_set,
            "Notebook": self.notebook,
            "InferenceService": self.inference_service,
            "Pod": self.pod,
        }
        return chosen.get(kind, ReclaimAction.RECOMMEND)


class ReclaimWhen(StrEnum):
    """When warned-and-due idle owners are acted on."""

    ALWAYS = "Always"  # as soon as their warning is over
    ON_PRESSURE = "OnPressure"  # only while GPU pods wait unschedulable, and only enough to fit them


class ReclaimRule(Model):
    """How idle GPUs are given back: act on each idle pod's top owner, so the GPU stays free."""

    actions: OwnerActions = Field(default_factory=OwnerActions)
    """The action per owner kind (Enforce mode only; Observe shows what would be done)."""
    reclaim_when: ReclaimWhen = ReclaimWhen.ALWAYS
    """Always: an idle owner is reclaimed once its warning is over. OnPressure: warnings still go out
    on time, but a due owner is reclaimed only while a GPU pod is Pending as unschedulable for lack
    of nvidia.com/gpu, and only the fewest owners whose GPUs make that pod fit (its GPU request,
    nodeSelector, required node affinity and tolerations against each node's allocatable GPUs)."""


class FaultEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Recovery(StrEnum):
    AUTOMATIC = "Automatic"
    MANUAL = "Manual"


class FaultKindBase(Model):
    enabled: bool = True
    """Detect this fault kind."""
    effect: FaultEffect = FaultEffect.NO_SCHEDULE
    """Taint effect on a faulty node (Enforce mode only); NoExecute drains the node first (see drainTimeout)."""


class EccFault(FaultKindBase):
    """ECC faults: volatile double-bit errors increasing, uncorrectable remapped rows, row-remap failure, retired pages pending."""

    recovery: Recovery = Recovery.MANUAL
    """Manual by default: an admin annotates the node gpuefficiency.io/fault-recovered=ecc after replacing or resetting the GPU."""
    recovery_after: Duration = "30m"
    """With Automatic recovery, how long the signals must be healthy before the taint is removed."""


#: XID codes that production GPU health systems treat as fatal.
DEFAULT_CRITICAL_XIDS = (48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 110, 119, 120, 136, 140, 143)
"""The node agent's default for its GPUHealthy condition (``--critical-xids``); policies choose by class."""
#: XID codes that are application errors, not hardware faults.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68)


class XidResolution(StrEnum):
    """What NVIDIA's XID catalog recommends for an XID (its resolution bucket, immediate action)."""

    IGNORE = "ignore"
    RESTART_APP = "restart-app"
    RESET_GPU = "reset-gpu"
    REBOOT_NODE = "reboot-node"
    CONTACT_SUPPORT = "contact-support"
    CHECK_HARDWARE = "check-hardware"
    UPDATE_SOFTWARE = "update-software"
    INVESTIGATE = "investigate"
    UNKNOWN = "unknown"


#: Classes that taint by default: the GPU itself needs a reset, a reboot or NVIDIA support.
DEFAULT_TAINT_CLASSES = (XidResolution.RESET_GPU, XidResolution.REBOOT_NODE, XidResolution.CONTACT_SUPPORT)


class XidRepeat(Model):
    """XID codes that matter only when they repeat on one GPU."""

    codes: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=256)
    """XID codes this rule covers."""
    count: int = Field(ge=2, le=1000)
    """Occurrences on one GPU within `within` before the XID taints."""
    within: Duration = "1h"
    """The window the occurrences are counted in."""


class XidFault(FaultKindBase):
    """XID errors reported by the driver. The dcgm-exporter gauge holds the last XID, so a change counts.

    Whether an XID taints: codes in `ignored` never do; codes in `critical` always do; any other code
    does when its class in the operator's XID catalogue (written from NVIDIA's XID catalog) is one of
    `taintClasses`. A code covered by `repeat` then taints only once it repeats often enough.
    """

    taint_classes: list[XidResolution] = Field(
        default_factory=lambda: list(DEFAULT_TAINT_CLASSES), max_length=16
    )
    """Resolution classes whose XIDs taint (ignore, restart-app, reset-gpu, reboot-node, contact-support, check-hardware, update-software, investigate, unknown for codes not in the catalogue)."""
    critical: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=512)
    """XID codes that taint whatever their class (an override of the catalogue)."""
    ignored: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=512)
    """XID codes never acted upon whatever their class; wins over critical."""
    repeat: list[XidRepeat] = Field(default_factory=list, max_length=64)
    """Codes that taint only past a count of occurrences on one GPU within a window."""
    incident_nodes: int = Field(default=3, ge=2, le=100000)
    """Application-class XIDs (restart-app or ignore) newly seen on at least this many nodes in one cycle are reported as one incident (one policy event) and never taint."""
    recovery: Recovery = Recovery.MANUAL
    """Manual by default: annotate the node gpuefficiency.io/fault-recovered=xid."""
    recovery_after: Duration = "30m"
    """With Automatic recovery, how long without a new critical XID before the taint is removed."""

    @model_validator(mode="after")
    def _one_rule_per_code(self) -> XidFault:
        seen: set[int] = set()
        for rule in self.repeat:
            twice = seen & set(rule.codes)
            if twice:
                raise ValueError(f"repeat: XID {sorted(twice)} listed in more than one rule")
            seen |= set(rule.codes)
        return self


class ThermalFault(FaultKindBase):
    """Heat: temperature over a limit, or thermal slowdown clock-event bits, for a duration."""

    gpu_temperature_above: float = Field(default=90.0, ge=0.0, le=150.0)
    """GPU temperature limit in degrees Celsius."""
    memory_temperature_above: float = Field(default=95.0, ge=0.0, le=150.0)
    """HBM temperature limit in degrees Celsius."""
    slowdown_clock_events: bool = True
    """Count the hardware/software thermal slowdown clock-event bits as over the limit."""
    for_duration: Duration = "2m"
    """How long the condition must hold before the node is tainted."""
    recovery: Recovery = Recovery.AUTOMATIC
    """Automatic by default: untaint after recoveryAfter of healthy readings."""
    recovery_after: Duration = "5m"
    """How long every reading must be healthy before the taint is removed."""


class PcieFault(Model):
    """A PCIe link trained below the GPU's maximum: fewer lanes (x8 of x16) at any load, or a lower generation while the GPU is busy.

    Judged over `lookback` on dcgm-exporter's DCGM_FI_DEV_PCIE_LINK_WIDTH/_GEN against _MAX_LINK_WIDTH/_GEN
    (the node agent reads the same from NVML). The GPU works, only its host transfers are slower: the node
    gets GPUDegraded=True and events, and is released automatically once the link is back at full width.
    """

    enabled: bool = True
    """Report down-trained links at all."""
    taint: bool = False
    """In Enforce mode, also taint the node gpuefficiency.io/gpu-fault=pcie:PreferNoSchedule under the faults circuit breaker (off: reported only)."""


class CircuitBreaker(Model):
    """Never quarantine more than a share of GPU nodes, and of GPUs, at once: mass faults are more likely bad data.

    Both caps apply: the node share bounds how many nodes hold any quarantine of ours, the GPU share
    how many GPUs it takes out (a node taint takes all of its GPUs, a device taint one).
    """

    max_tainted_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """Largest share of in-scope GPU nodes held tainted at once."""
    max_tainted_nodes: int | None = Field(default=None, ge=0)
    """Optional absolute cap on tainted nodes."""
    max_quarantined_gpu_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """Largest share of in-scope GPUs held quarantined at once: every GPU of a tainted node, plus each GPU under a DeviceTaintRule of ours. Default: maxTaintedFraction. While above zero, at least the GPUs of the largest in-scope node, as one node always may be tainted."""

    @property
    def gpu_fraction(self) -> float:
        """The GPU share in force: maxQuarantinedGpuFraction, else maxTaintedFraction."""
        if self.max_quarantined_gpu_fraction is None:
            return self.max_tainted_fraction
        return self.max_quarantined_gpu_fraction


class DeviceTaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class DeviceQuarantine(Model):
    """Single-GPU quarantine on nodes whose GPUs are DRA devices (a ResourceSlice lists them with a `uuid` attribute).

    A fault that a GPU reset repairs (an XID of the reset-gpu class on every GPU held) gets one
    DeviceTaintRule (resource.k8s.io/v1beta2) per faulty device instead of a node taint, so the
    node stays schedulable for its healthy GPUs. Other faults, and nodes whose GPUs come from the
    device plugin, keep the node taint.
    """

    enabled: bool = True
    """Quarantine single DRA devices where possible (off: always the node taint)."""
    effect: DeviceTaintEffect = DeviceTaintEffect.NO_SCHEDULE
    """NoSchedule keeps new claims off the device; NoExecute also removes the pods using it (drained first, see drainTimeout)."""


class FaultRules(Model):
    """GPU fault quarantine. Conditions and events are written in Observe mode too; taints only in Enforce."""

    enabled: bool = True
    """Detect faults at all."""
    ecc: EccFault = Field(default_factory=EccFault)
    """Double-bit ECC and row remapping faults."""
    xid: XidFault = Field(default_factory=XidFault)
    """Critical driver XID errors."""
    thermal: ThermalFault = Field(default_factory=ThermalFault)
    """Temperature and thermal slowdown."""
    pcie: PcieFault = Field(default_factory=PcieFault)
    """PCIe links trained below the GPU's maximum width or generation (degraded, never tainted by default)."""
    lookback: Duration = "2m"
    """Window in which a counter increase or XID change counts as a new fault."""
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    """Cap on quarantined nodes."""
    device_quarantine: DeviceQuarantine = Field(default_factory=DeviceQuarantine)
    """Single-GPU quarantine with DRA device taints (Enforce mode only)."""
    drain_timeout: Duration = "10m"
    """Where the effect is NoExecute (a kind's effect, or deviceQuarantine.effect): the operator first sets NoSchedule, evicts the pods on the faulty node (node taint) or those whose ResourceClaims hold the faulty GPU (device taint) through the Eviction API, so PodDisruptionBudgets are honoured and a refusal is retried every cycle, and sets NoExecute once they are gone or after this long (then Kubernetes removes what is left, without PodDisruptionBudgets). 0s sets NoExecute at once."""


class StragglerRule(Model):
    """Stragglers: the GPU of a multi-GPU job that runs markedly slower than its peers.

    A synchronous job runs at the speed of its slowest GPU. Each GPU's SM activity, tensor activity,
    SM clock and power are compared with its job group's median, robustly (median and median
    absolute deviation, so one slow GPU cannot hide itself by widening the spread).
    """

    enabled: bool = False
    """Judge job groups for stragglers at all (off by default)."""
    group_by: list[str] = Field(default_factory=list, max_length=16)
    """Pod label keys that also name a job group (tried before the well-known job labels and owners)."""
    min_gpus: int = Field(default=4, ge=3, le=100000)
    """Groups with fewer GPUs are not judged (a median of two says nothing about which one is slow)."""
    mad_factor: float = Field(default=3.0, ge=1.0, le=100.0)
    """How many scaled median absolute deviations (MAD x 1.4826) below the median a GPU must be."""
    min_shortfall: float = Field(default=0.1, ge=0.01, le=0.9)
    """And how far below the median, as a fraction of it (0.1: 10 % slower). Both must hold."""
    busy_above: float = Field(default=0.3, ge=0.0, le=1.0)
    """A group whose median SM activity is below this is idle or warming up and is not judged."""
    for_duration: Duration = "5m"
    """How long a GPU must stay a straggler before it is reported."""
    quarantine_hardware: bool = False
    """Hold the node of a hardware straggler (thermal, power, clock or PCIe link cause) as the straggler fault: GPUDegraded=True and its events (in Observe mode too), and in Enforce mode the taint gpuefficiency.io/gpu-fault=straggler:PreferNoSchedule under the faults circuit breaker; released once its group shows the GPU back at speed, at least forDuration after detection."""


class SinkType(StrEnum):
    CLOUD_EVENTS = "CloudEvents"  # CloudEvents 1.0, structured mode (application/cloudevents+json)
    SLACK = "Slack"  # a Slack incoming webhook (text + blocks); Mattermost and others accept it too


#: Event reasons a sink can be sent: the warnings and actions a person may want to hear of.
NotifyReason = Literal[
    "GPUIdleEvictionScheduled",
    "GPUIdleEvicted",
    "GPUReclaimed",
    "EvictionBlocked",
    "GPUActiveAgain",
    "GPUIdle",
    "GPUUnderutilized",
    "ReclaimSkipped",
    "GPUFaultDetected",
    "NodeTainted",
    "NodeUntainted",
]
#: What a sink is sent when its ``reasons`` is empty: the warning and the actions that take GPUs.
DEFAULT_NOTIFY_REASONS: tuple[str, ...] = (
    "GPUIdleEvictionScheduled",
    "GPUIdleEvicted",
    "GPUReclaimed",
    "EvictionBlocked",
    "GPUFaultDetected",
    "NodeTainted",
)


class NotifySink(Model):
    """One place warnings and actions are posted to (asynchronously: a failing sink never slows a cycle)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The sink's name (a DNS label), in metrics, conditions and logs."""
    type: SinkType
    """CloudEvents (structured-mode JSON for any webhook) or Slack (incoming-webhook text and blocks)."""
    url_secret_key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the webhook URL in the Secret the chart mounts into the operator (notify.secretName); the operator reads no Secrets."""
    reasons: list[NotifyReason] = Field(default_factory=list, max_length=16)
    """Event reasons sent; empty: GPUIdleEvictionScheduled, GPUIdleEvicted, GPUReclaimed, EvictionBlocked, GPUFaultDetected, NodeTainted."""
    namespaces: list[str] = Field(default_factory=list, max_length=256)
    """Only pods in these namespaces (empty: all); node events (faults) are sent only when this is empty."""
    max_per_minute: int = Field(default=30, ge=1, le=600)
    """Rate limit of posts to this sink; a burst waits in a bounded queue, the excess is dropped and counted."""

    def wants(self, reason: str, namespace: str) -> bool:
        """Whether a notification with this reason about an object in ``namespace`` goes here."""
        if reason not in (self.reasons or DEFAULT_NOTIFY_REASONS):
            return False
        if not self.namespaces:
            return True
        return bool(namespace) and namespace in self.namespaces


class GPUEfficiencyPolicySpec(Model):
    """Desired behaviour: what to watch, how to judge it and what the operator may do."""

    mode: Mode = Mode.OBSERVE
    """Observe (default) only annotates and emits events; Enforce also evicts idle pods and taints faulty nodes."""
    selection: Selection = Field(default_factory=Selection)
    """Which namespaces, pods and nodes are in scope."""
    interval: Duration = "60s"
    """How often the policy is evaluated."""
    window: Duration = "10m"
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
        from gpu_efficiency.api.durations import parse_duration

        if parse_duration(self.window) < parse_duration(self.interval):
            raise ValueError("window must be at least interval")
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
