"""The scenario file: a stable, validated contract shared by tests, the demo, benchmarks and outside checks.

YAML, camelCase like Kubernetes manifests, unknown fields rejected. ``load_scenario`` turns any
problem into a ``ScenarioError`` that names the file, the place in the document (with its line) and
what is wrong, so a broken scenario is fixed in one read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency.api.policy import Duration, GPUEfficiencyPolicySpec
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.exposition import PodLabels
from gpu_efficiency_sim.faults import ExporterDown, FaultKind, Garbage, parse_link
from gpu_efficiency_sim.generations import DEFAULT_EXPORTER, SIMULATED
from gpu_efficiency_sim.gpu_models import GPUModel, find_model
from gpu_efficiency_sim.profiles import PROFILES

PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


def seconds(duration: str) -> float:
    return parse_duration(duration)


# ---- simulator options ------------------------------------------------------------------------


def _simulated_exporter(value: object) -> object:
    """A generation the simulator serves; anything else (``unknown``, ``4.9`` read as a number) is named."""
    allowed = [g.value for g in SIMULATED]
    if value is not None and (not isinstance(value, str) or value not in allowed):
        raise ValueError(f"unknown exporter {value!r}; use one of {', '.join(allowed)}")
    return value


#: A dcgm-exporter generation the simulator can serve (``gpu_efficiency_sim.generations``).
Exporter = Annotated[
    Generation,
    BeforeValidator(_simulated_exporter),
    WithJsonSchema({"type": "string", "enum": [g.value for g in SIMULATED]}),
]


class SimulatorOptions(Model):
    """How the simulated dcgm-exporter presents its series."""

    pod_labels: PodLabels = PodLabels.STANDARD
    """standard (pod/namespace/container), exported (exported_pod/... plus the exporter's own pod
    labels, as Prometheus writes them with honor_labels false), legacy (pod_name/pod_namespace/
    container_name) or none."""
    sm_active: bool = True
    """false: dcgm-exporter's default CSV (no SM_ACTIVE, occupancy, tensor, DRAM, PCIe/NVLink PROF)."""
    clock_events_metric: (
        Literal["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] | None
    ) = None
    """The clock-event metric name on every node: the new one, or the old CLOCK_THROTTLE_REASONS;
    empty: the exporter generation's (the old name on legacy, the new one otherwise)."""
    exporter: Exporter = DEFAULT_EXPORTER
    """The dcgm-exporter generation of nodes that name none: legacy (CLOCK_THROTTLE_REASONS, label
    Hostname), 4.x (up to 4.8.2: CLOCKS_EVENT_REASONS, Hostname; the default), 4.8.3+ (label hostname,
    DCGM_EXP_XID_ERRORS_COUNT and DCGM_EXP_CLOCK_EVENTS_COUNT), 4.9+ (DCGM 4.6+ names such as
    DCGM_FI_PROF_SM_UTIL_RATIO and DCGM_FI_DEV_GPU_UTIL_RATIO, units ratio/Hz/J/bytes, hostname, the
    DCGM_EXP counters) or default-csv (4.8.3+ with dcgm-exporter's default-counters.csv: no ECC, retired
    pages, clock events, PCIe link, SM_ACTIVE, occupancy, NVLink rates or DCGM_EXP counters)."""
    driver_version: str = "550.90.07"
    """The DCGM_FI_DRIVER_VERSION label; empty leaves the label out."""


# ---- nodes ------------------------------------------------------------------------------------


class Taint(Model):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeSpec(Model):
    """Simulated GPU nodes: one ``name``, or ``count`` nodes named ``prefix``0, ``prefix``1, ..."""

    name: str | None = Field(default=None, pattern=_DNS_LABEL, max_length=63)
    """Node name."""
    prefix: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*)?$", max_length=55)
    """Name prefix of ``count`` nodes."""
    count: int = Field(default=1, ge=1, le=5000)
    """Number of nodes with ``prefix``."""
    gpus: int = Field(default=8, ge=1, le=16)
    """GPUs per node."""
    time_slicing: int = Field(default=1, ge=1, le=16)
    """Pods per GPU, as the device plugin's time-slicing ``replicas``: the node advertises ``gpus`` x
    this many nvidia.com/gpu and each GPU's series are attributed to every pod sharing it."""
    model: str = "NVIDIA-H100-80GB-HBM3"
    """GPU model: the nvidia.com/gpu.product label or the modelName (see `gpu-efficiency-sim models`)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra node labels."""
    taints: list[Taint] = Field(default_factory=list)
    """Node taints (workloads then need tolerations)."""
    dra: bool = False
    """Publish the GPUs as DRA devices (a ResourceSlice of driver gpu.nvidia.com, one device per GPU
    with its uuid) instead of nvidia.com/gpu capacity, as NVIDIA's DRA driver would."""
    exporter: Exporter | None = None
    """The dcgm-exporter generation serving these nodes (see simulator.exporter); empty: the
    simulator's. Nodes of different generations make a fleet mid-upgrade."""

    @model_validator(mode="after")
    def _name_or_prefix(self) -> NodeSpec:
        if (self.name is None) == (self.prefix is None):
            raise ValueError("give exactly one of name or prefix (with count)")
        if self.name is not None and self.count != 1:
            raise ValueError("count needs prefix, not name")
        if self.dra and self.time_slicing != 1:
            raise ValueError("timeSlicing is the device plugin's (nvidia.com/gpu); a dra node has none")
        return self

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        find_model(value)
        return value

    @property
    def gpu_model(self) -> GPUModel:
        return find_model(self.model)

    @property
    def names(self) -> list[str]:
        if self.name is not None:
            return [self.name]
        return [f"{self.prefix}{i}" for i in range(self.count)]


# ---- workloads --------------------------------------------------------------------------------


class WorkloadKind(StrEnum):
    POD = "Pod"
    DEPLOYMENT = "Deployment"
    JOB = "Job"
    STATEFUL_SET = "StatefulSet"


class PDBSpec(Model):
    """A PodDisruptionBudget over the workload's pods."""

    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    @model_validator(mode="after")
    def _one(self) -> PDBSpec:
        if (self.min_available is None) == (self.max_unavailable is None):
            raise ValueError("give exactly one of minAvailable or maxUnavailable")
        return self


def _check_profile(name: str) -> str:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return name


class ProfileChange(Model):
    at: Duration
    """When (from scenario start) the workload switches profile."""
    profile: str
    """The profile from then on."""

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        return _check_profile(value)


class TimelineEntry(Model):
    at: Duration
    """When (from scenario start) these values take effect; they hold until a later entry changes them."""
    values: dict[str, float | None]
    """dcgm-exporter metric name -> value in the exporter's units; null returns the metric to the profile."""

    @field_validator("values")
    @classmethod
    def _known_metrics(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        unknown = sorted(set(values) - set(catalog.METRIC_NAMES))
        if unknown:
            raise ValueError(
                f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(catalog.METRIC_NAMES)}"
            )
        return values


class WorkloadSpec(Model):
    """A GPU workload: the Kubernetes object the runner creates and what its GPUs do over time."""

    name: str = Field(pattern=_DNS_LABEL, max_length=52)
    """Object name (and the pod label sim.gpuefficiency.io/workload)."""
    namespace: str = Field(pattern=_DNS_LABEL, max_length=50)
    """Namespace (created by the runner, with --namespace-prefix applied)."""
    kind: WorkloadKind = WorkloadKind.DEPLOYMENT
    """Pod, Deployment, Job or StatefulSet."""
    replicas: int = Field(default=1, ge=0, le=1000)
    """Pods (Job: parallelism and completions)."""
    gpus: int = Field(default=1, ge=0, le=16)
    """nvidia.com/gpu per pod (with dra: GPUs per pod's ResourceClaim)."""
    dra: bool = False
    """Request the GPUs through a ResourceClaim (DeviceClass gpu.nvidia.com) for nodes with dra."""
    node: str | None = None
    """A scenario node to pin the pods to (through the scheduler, by kubernetes.io/hostname)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Extra node selector labels."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Pod tolerations, as in a pod spec."""
    pdb: PDBSpec | None = None
    """A PodDisruptionBudget over the workload's pods."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra pod labels."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Pod annotations (e.g. gpuefficiency.io/exempt)."""
    priority_class_name: str | None = None
    """The pods' priorityClassName."""
    termination_grace_period_seconds: int | None = Field(default=None, ge=0)
    """The pods' grace period (KWOK honours it)."""
    image: str = PAUSE_IMAGE
    """Container image (never pulled under KWOK)."""
    profile: str = "idle"
    """What the GPUs do at the start (see `gpu-efficiency-sim profiles`)."""
    profile_changes: list[ProfileChange] = Field(default_factory=list)
    """Later switches of profile."""
    timeline: list[TimelineEntry] = Field(default_factory=list)
    """Explicit metric values overriding the profile from given times."""
    start_at: Duration | None = None
    """Create the workload this long after the scenario starts instead of at once (a job that
    arrives while the cluster is full and waits, Pending, for GPUs)."""

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        return _check_profile(value)

    @model_validator(mode="after")
    def _shape(self) -> WorkloadSpec:
        if self.kind is WorkloadKind.POD and self.replicas != 1:
            raise ValueError("kind Pod has exactly one replica")
        return self


# ---- faults -----------------------------------------------------------------------------------


class FaultSpec(Model):
    """A timed fault injection on a node's GPU(s), or on the whole exporter."""

    at: Duration
    """When (from scenario start) the fault starts."""
    kind: FaultKind
    """ecc, xid, temperature, clock-events, gap, exporter-down, garbage, remapped-rows, row-remap-failure,
    slowdown, pcie-link."""
    node: str | None = None
    """The scenario node hit (required but for exporter-down; for gap and garbage, empty means all nodes)."""
    gpu: int | None = Field(default=None, ge=0)
    """The GPU index hit; empty means every GPU of the node."""
    value: int | float | str | list[str] | None = None
    """ecc/remapped-rows: errors added (1); xid: the code (79); temperature: degrees C (95); clock-events:
    a bitmask or bit names (sw-thermal, hw-thermal, hw-slowdown, ...); exporter-down: 503, refused or hang;
    garbage: nan, inf, negative or counter-reset; slowdown: the speed left, 0-1 (0.6: SM clock and power x 0.6);
    pcie-link: the link the GPU trains to at most, x8, gen3 or gen3x8 (a down-trained link)."""
    duration: Duration | None = None
    """How long it lasts; empty means to the end (counters stay raised regardless)."""
    metric: str | None = None
    """gap and garbage: only this metric (default: gap drops all series of the GPU; garbage picks by kind)."""

    @model_validator(mode="after")
    def _by_kind(self) -> FaultSpec:
        kind = self.kind
        if kind is FaultKind.EXPORTER_DOWN:
            if self.node is not None or self.gpu is not None:
                raise ValueError("exporter-down takes the whole exporter down: no node or gpu")
            if self.value is not None and str(self.value) not in {m.value for m in ExporterDown}:
                raise ValueError("exporter-down value must be 503, refused or hang")
        elif kind not in (FaultKind.GAP, FaultKind.GARBAGE) and self.node is None:
            raise ValueError(f"{kind} needs a node")
        if kind is FaultKind.XID and not isinstance(self.value, int):
            raise ValueError("xid needs an integer value (the XID code, e.g. 79)")
        if kind is FaultKind.TEMPERATURE and not isinstance(self.value, int | float):
            raise ValueError("temperature needs a value in degrees C")
        if kind is FaultKind.SLOWDOWN and not (
            self.value is None or (isinstance(self.value, int | float) and 0 < self.value <= 1)
        ):
            raise ValueError("slowdown value is the GPU's speed, a fraction in (0, 1] (0.6: 40 % slower)")
        if kind is FaultKind.PCIE_LINK:
            parse_link(None if isinstance(self.value, list) else self.value)
        if kind is FaultKind.GARBAGE and str(self.value) not in {g.value for g in Garbage}:
            raise ValueError(f"garbage value must be one of {', '.join(g.value for g in Garbage)}")
        counted = kind in (FaultKind.ECC, FaultKind.REMAPPED_ROWS)
        if counted and self.value is not None and (not isinstance(self.value, int) or self.value < 1):
            raise ValueError(f"{kind} value is a positive count of errors")
        if kind is FaultKind.CLOCK_EVENTS:
            self.clock_event_bits()
        if self.metric is not None:
            if kind not in (FaultKind.GAP, FaultKind.GARBAGE):
                raise ValueError("metric applies to gap and garbage faults only")
            if self.metric not in catalog.METRIC_NAMES:
                raise ValueError(f"unknown metric {self.metric!r}")
        return self

    def clock_event_bits(self) -> int:
        value = self.value
        if value is None:
            return catalog.THERMAL_SLOWDOWN_BITS
        if isinstance(value, int):
            return value
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list):
            raise ValueError("clock-events value is a bitmask or a list of bit names")
        bits = 0
        for name in names:
            if name not in catalog.CLOCK_EVENT_NAMES:
                raise ValueError(
                    f"unknown clock-event bit {name!r}; known: {', '.join(catalog.CLOCK_EVENT_NAMES)}"
                )
            bits |= catalog.CLOCK_EVENT_NAMES[name]
        return bits


# ---- policies ---------------------------------------------------------------------------------


class PolicyFile(Model):
    """A policy read from a file, relative to the scenario: a GPUEfficiencyPolicy manifest or a bare spec."""

    file: str


# ---- expectations -----------------------------------------------------------------------------


class PodsEvicted(Model):
    workload: str
    """The scenario workload."""
    pods: Literal["original", "any"] = "original"
    """original: one of the pods present when the workload first ran; any: any of its pods."""


class WorkloadRef(Model):
    workload: str
    """The scenario workload."""


class PodAnnotation(Model):
    """An annotation on the workload's current pods (not terminating)."""

    workload: str
    key: str
    equals: str | None = None
    not_equals: str | None = None
    one_of: list[str] | None = None
    exists: bool | None = None
    """true: the key is present; false: it is absent."""
    contains: list[str] | None = None
    """Every one of these strings is in the value."""
    pods: Literal["all", "any"] = "all"
    """all: every current pod (and at least one) must match; any: at least one."""

    @model_validator(mode="after")
    def _one_test(self) -> PodAnnotation:
        tests = (self.equals, self.not_equals, self.one_of, self.exists, self.contains)
        if len([x for x in tests if x is not None]) != 1:
            raise ValueError("give exactly one of equals, notEquals, oneOf, exists or contains")
        return self


class EventCheck(Model):
    """A Kubernetes event with this reason on a workload's pods (its own object with ``owner``), a
    node, or a policy."""

    reason: str
    workload: str | None = None
    owner: bool = False
    """With workload: the event is on the workload's own object (Job, Deployment...), not its pods."""
    node: str | None = None
    policy: str | None = None
    type: Literal["Normal", "Warning"] | None = None
    message_contains: str | None = None
    absent: bool = False
    """true: no such event may exist (held for the whole duration by default)."""

    @model_validator(mode="after")
    def _one_object(self) -> EventCheck:
        if sum(x is not None for x in (self.workload, self.node, self.policy)) != 1:
            raise ValueError("give exactly one of workload, node or policy")
        if self.owner and self.workload is None:
            raise ValueError("owner applies to a workload's events only")
        return self


class NodeTaint(Model):
    node: str
    key: str = "gpuefficiency.io/gpu-fault"
    value: str | None = None
    effect: str | None = None


class NodeCondition(Model):
    node: str
    type: str = "GPUHealthy"
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None


class PolicyCondition(Model):
    policy: str
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None


class ValueTest(Model):
    equals: int | float | str | bool | None = None
    at_least: float | None = None
    at_most: float | None = None
    exists: bool | None = None

    @model_validator(mode="after")
    def _some_test(self) -> ValueTest:
        if all(x is None for x in (self.equals, self.at_least, self.at_most, self.exists)):
            raise ValueError("give equals, atLeast, atMost or exists")
        return self


class PolicyStatus(ValueTest):
    policy: str
    field: str
    """Dotted path in the policy's status, camelCase as served: evictionsTotal, verdicts.idle, ..."""


class WorkloadObject(ValueTest):
    """The workload's own object (Deployment, StatefulSet or Job, not its pods): a field by dotted
    path (spec.replicas, spec.suspend) or one of its annotations; a missing value is None."""

    workload: str
    field: str | None = None
    annotation: str | None = None

    @model_validator(mode="after")
    def _one_place(self) -> WorkloadObject:
        if (self.field is None) == (self.annotation is None):
            raise ValueError("give exactly one of field and annotation")
        return self


class CurrentPods(ValueTest):
    """How many of the workload's pods exist and are not terminating or finished (a scaled-to-zero
    or suspended owner has none; a recreated one has its replacement)."""

    workload: str
    phase: Literal["Pending", "Running"] | None = None
    """Count only the pods in this phase (Running: the pod got its GPUs and started)."""


class PromQL(ValueTest):
    """A PromQL instant query against the scenario's Prometheus: some series must pass the tests
    (exists: false means the query returns nothing)."""

    query: str


EXPECTATION_KINDS: Final = (
    "podEvicted",
    "podNotEvicted",
    "podAnnotation",
    "event",
    "nodeTainted",
    "nodeNotTainted",
    "nodeCondition",
    "policyCondition",
    "policyStatus",
    "metric",
    "workloadObject",
    "currentPods",
)
#: Kinds that are held (must stay true for the whole duration) unless ``hold`` says otherwise.
HELD_BY_DEFAULT: Final = frozenset({"podNotEvicted", "nodeNotTainted"})


class Expectation(Model):
    """One check with a deadline. Exactly one of the check fields is set."""

    name: str | None = None
    """Printed with the result; default: a summary of the check."""
    within: Duration
    """Deadline from scenario start (or, with hold, the end of the period that must hold)."""
    after: Duration = Duration("0s")
    """Observation starts here: earlier observations neither pass nor fail it."""
    hold: bool | None = None
    """true: must be true at every observation from ``after`` to ``within``. Default true for
    podNotEvicted, nodeNotTainted and absent events, false otherwise."""
    pod_evicted: PodsEvicted | None = None
    pod_not_evicted: WorkloadRef | None = None
    pod_annotation: PodAnnotation | None = None
    event: EventCheck | None = None
    node_tainted: NodeTaint | None = None
    node_not_tainted: NodeTaint | None = None
    node_condition: NodeCondition | None = None
    policy_condition: PolicyCondition | None = None
    policy_status: PolicyStatus | None = None
    metric: PromQL | None = None
    workload_object: WorkloadObject | None = None
    current_pods: CurrentPods | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Expectation:
        given = [k for k in EXPECTATION_KINDS if getattr(self, _snake(k)) is not None]
        if len(given) != 1:
            found = ", ".join(given) or "none"
            raise ValueError(f"give exactly one check of {', '.join(EXPECTATION_KINDS)} (found {found})")
        if seconds(self.after) > seconds(self.within):
            raise ValueError("after must not be later than within")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in EXPECTATION_KINDS if getattr(self, _snake(k)) is not None)

    @property
    def check(self) -> Model:
        check = getattr(self, _snake(self.kind))
        assert isinstance(check, Model)
        return check

    @property
    def held(self) -> bool:
        if self.hold is not None:
            return self.hold
        if self.event is not None:
            return self.event.absent
        return self.kind in HELD_BY_DEFAULT


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


# ---- the document -----------------------------------------------------------------------------


class NamespaceSpec(Model):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Scenario(Model):
    """A scenario: simulated GPU nodes, workloads and what their GPUs do, faults, policies, expectations."""

    name: str | None = Field(default=None, pattern=_DNS_LABEL, max_length=40)
    """Scenario name (labels, Prometheus target file); default: the file name."""
    description: str = ""
    """What the scenario shows."""
    needs_operator: bool = True
    """false: the expectations hold without the operator (simulator-only scenarios)."""
    isolate_nodes: bool = True
    """Taint the scenario's nodes sim.gpuefficiency.io/scenario=<name>:NoSchedule (its workloads tolerate
    it) so that other pods on a shared cluster cannot land on them."""
    scope_policies: bool = True
    """Policies whose namespace or node selector is empty select only this scenario's namespaces and nodes."""
    simulator: SimulatorOptions = Field(default_factory=SimulatorOptions)
    """How the simulated dcgm-exporter presents its series."""
    nodes: list[NodeSpec] = Field(min_length=1)
    """Simulated GPU nodes."""
    namespaces: dict[str, NamespaceSpec] = Field(default_factory=dict)
    """Labels and annotations of namespaces (workload namespaces are created anyway)."""
    workloads: list[WorkloadSpec] = Field(default_factory=list)
    """GPU workloads."""
    faults: list[FaultSpec] = Field(default_factory=list)
    """Timed fault injections."""
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """GPUEfficiencyPolicy name -> its spec inline, or {file: path relative to the scenario}."""
    expectations: list[Expectation] = Field(default_factory=list)
    """Checks with deadlines; the run fails if any fails."""

    @property
    def node_names(self) -> list[str]:
        return [n for spec in self.nodes for n in spec.names]

    def node_spec(self, name: str) -> NodeSpec:
        return next(spec for spec in self.nodes if name in spec.names)

    def workload(self, name: str) -> WorkloadSpec:
        return next(w for w in self.workloads if w.name == name)

    @property
    def namespace_names(self) -> list[str]:
        # Each once, in order: several workloads share a namespace (the demo's view listed each
        # namespace's pods and events once per workload in it).
        return list(dict.fromkeys([*self.namespaces, *(w.namespace for w in self.workloads)]))

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        """Cross references; raised one at a time with the offending place named."""
        nodes = self.node_names
        dupes = sorted({n for n in nodes if nodes.count(n) > 1})
        if dupes:
            raise ValueError(f"nodes: duplicate node names {', '.join(dupes)}")
        seen: set[tuple[str, str]] = set()
        for i, w in enumerate(self.workloads):
            if (w.namespace, w.name) in seen:
                raise ValueError(f"workloads[{i}]: duplicate workload {w.namespace}/{w.name}")
            seen.add((w.namespace, w.name))
            if w.node is not None and w.node not in nodes:
                raise ValueError(f"workloads[{i}].node: {w.node!r} is not a scenario node")
        names = [w.name for w in self.workloads]
        for i, f in enumerate(self.faults):
            if f.node is not None and f.node not in nodes:
                raise ValueError(f"faults[{i}].node: {f.node!r} is not a scenario node")
            if f.node is not None and f.gpu is not None and f.gpu >= self.node_spec(f.node).gpus:
                raise ValueError(
                    f"faults[{i}].gpu: node {f.node} has GPUs 0-{self.node_spec(f.node).gpus - 1}"
                )
        for i, e in enumerate(self.expectations):
            check = e.check
            where = f"expectations[{i}].{e.kind}"
            workload = getattr(check, "workload", None)
            if workload is not None and workload not in names:
                raise ValueError(f"{where}.workload: {workload!r} is not a scenario workload")
            if workload is not None and names.count(workload) > 1:
                raise ValueError(f"{where}.workload: {workload!r} names workloads in several namespaces")
            node = getattr(check, "node", None)
            if node is not None and node not in nodes:
                raise ValueError(f"{where}.node: {node!r} is not a scenario node")
            policy = getattr(check, "policy", None)
            if policy is not None and policy not in self.policies:
                raise ValueError(f"{where}.policy: {policy!r} is not a scenario policy")
        for name in self.policies:
            if not re.match(_DNS_LABEL, name):
                raise ValueError(f"policies: {name!r} is not a valid object name")
        return self


# ---- loading ----------------------------------------------------------------------------------


class ScenarioError(Exception):
    """A scenario that cannot be used, with every problem located."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"{self.path}: invalid scenario:\n" + "\n".join(f"  {p}" for p in problems))


class LoadedScenario:
    """A validated scenario with its policies resolved to specs (files read, manifests unwrapped)."""

    def __init__(self, path: Path, scenario: Scenario, policies: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.scenario = scenario
        self.policies = policies

    @property
    def name(self) -> str:
        return self.scenario.name or _dns_name(self.path.stem)


def _dns_name(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "scenario"


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", part):
            out += ("." if out else "") + part
        else:
            out += f"[{part!r}]"
    return out or "(document)"


def _line(tree: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of ``loc`` in the composed YAML, as deep as the path can be followed."""
    node, line = tree, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    nxt = value
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            nxt = node.value[part]
        node = nxt
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _problems(
    error: ValidationError, tree: yaml.Node | None, prefix: tuple[int | str, ...] = ()
) -> list[str]:
    out = []
    for item in error.errors():
        loc = prefix + tuple(p for p in item["loc"] if not str(p).startswith("function-"))
        message = item["msg"].removeprefix("Value error, ")
        pattern = str((item.get("ctx") or {}).get("pattern", ""))
        if item["type"] == "string_pattern_mismatch" and "ms|s|m" in pattern:
            message = f"invalid duration {item['input']!r}: use forms like 30s, 5m, 1h30m"
        # A validator on a model names the model's path; a message starting with a path refines it.
        refined = re.match(r"^([a-zA-Z]+(\[\d+\])?(\.[a-zA-Z]+(\[\d+\])?)*): (.*)$", message, re.S)
        if refined and loc == prefix and refined.group(1).split("[")[0].split(".")[0] in _TOP_LEVEL:
            path = refined.group(1)
            message = refined.group(5)
            loc = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", path) if p)
        where = _location(loc)
        line = _line(tree, loc)
        out.append(f"{where}{f' (line {line})' if line else ''}: {message}")
    return out


_TOP_LEVEL: Final = frozenset(f.alias or name for name, f in Scenario.model_fields.items())


def _resolve_policy(
    base: Path, name: str, entry: Mapping[str, Any], tree: yaml.Node | None
) -> tuple[dict[str, Any] | None, list[str]]:
    """The spec of one policy entry, validated; problems located under policies.<name>."""
    where: tuple[int | str, ...] = ("policies", name)
    spec: Any = entry
    if set(entry) == {"file"}:
        try:
            ref = PolicyFile.model_validate(entry)
        except ValidationError as e:
            return None, _problems(e, tree, where)
        path = (base / ref.file).resolve()
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            return None, [f"{_location(where)}.file: cannot read {path}: {e}"]
        if not isinstance(document, dict):
            return None, [f"{_location(where)}.file: {path} is not a mapping"]
        spec = document.get("spec", {}) if "kind" in document or "apiVersion" in document else document
        tree = None
        where = (*where, f"file {ref.file}")
    if not isinstance(spec, dict):
        return None, [f"{_location(where)}: a policy is a spec mapping or {{file: path}}"]
    try:
        GPUEfficiencyPolicySpec.model_validate(spec)
    except ValidationError as e:
        return None, _problems(e, tree, where)
    return dict(spec), []


def parse_scenario(text: str, path: Path | str = "<scenario>") -> LoadedScenario:
    """Validate scenario YAML; policy files are looked up next to ``path``."""
    path = Path(path)
    try:
        tree = yaml.compose(text)
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioError(path, [f"{where}not valid YAML: {problem}"]) from None
    if not isinstance(document, dict):
        raise ScenarioError(path, ["(document): a scenario is a mapping with nodes, workloads, ..."])
    try:
        scenario = Scenario.model_validate(document)
    except ValidationError as e:
        raise ScenarioError(path, _problems(e, tree)) from None
    policies: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, entry in scenario.policies.items():
        spec, found = _resolve_policy(path.parent, name, entry, tree)
        problems += found
        if spec is not None:
            policies[name] = spec
    if problems:
        raise ScenarioError(path, problems)
    return LoadedScenario(path, scenario, policies)


def load_scenario(path: Path | str) -> LoadedScenario:
    """Read and validate a scenario file; raise ScenarioError naming the file and each problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(path, [f"cannot read: {e.strerror or e}"]) from None
    return parse_scenario(text, path)


def json_schema() -> dict[str, Any]:
    """JSON schema of the scenario format, with the policy spec schema inlined under policies."""
    schema = Scenario.model_json_schema(by_alias=True)
    spec = GPUEfficiencyPolicySpec.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    defs = schema.setdefault("$defs", {})
    defs.update(spec.pop("$defs", {}))
    defs["GPUEfficiencyPolicySpec"] = spec
    defs["PolicyFile"] = PolicyFile.model_json_schema(by_alias=True)
    schema["properties"]["policies"]["additionalProperties"] = {
        "anyOf": [{"$ref": "#/$defs/PolicyFile"}, {"$ref": "#/$defs/GPUEfficiencyPolicySpec"}]
    }
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpu-efficiency simulator scenario"
    return schema
