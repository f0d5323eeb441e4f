"""The simulated GPU fleet: nodes, their GPUs, who holds them, what they do, and the /metrics text.

Inputs arrive from outside (nodes and pods from the Kubernetes API or a test, workloads and faults
from a scenario); everything else is computed from the simulator clock, so a frame can be rendered
for any instant. Rendering a shard (a subset of nodes) lets one process serve many targets.
"""

from __future__ import annotations

import math
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from gpu_efficiency.api.exporter_fields import CLOCK_EVENTS_COUNT, XID_COUNT, Generation
from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog, faults, profiles
from gpu_efficiency_sim.allocation import GPUAllocator, Holder, PodInfo
from gpu_efficiency_sim.exposition import PodLabels, Reading, format_value, gpu_labels, header
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.generations import (
    CLOCK_EVENT_LABELS,
    COUNT_WINDOW_MS,
    DEFAULT_EXPORTER,
    Presentation,
    clock_event_count_labels,
    presentation,
    xid_count_labels,
)
from gpu_efficiency_sim.gpu_models import GPUModel
from gpu_efficiency_sim.noise import seed_for, uniform

#: Pod label naming the scenario workload a pod belongs to (set by the runner on pod templates).
WORKLOAD_LABEL: Final = "sim.gpuefficiency.io/workload"
#: Pod annotation naming the profile the pod plays, before its scenario workload's (one replica busy
#: while the others idle; annotate a running pod to switch what its GPUs do).
PROFILE_ANNOTATION: Final = "sim.gpuefficiency.io/profile"
FREE_GPU_PROFILE: Final = "idle"
#: GPU feature discovery's node label for time-slicing: pods per GPU (``replicas``).
SLICES_LABEL: Final = "nvidia.com/gpu.replicas"
#: Profiles that do nothing: a shared GPU plays the first of its pods' profiles not among them.
_RESTING: Final = frozenset({"idle", "idle-holding-memory"})

#: (index, count): the GPUs of nodes whose name hashes to ``index`` modulo ``count``. Hashing (not
#: ranges) keeps a node on the same target while nodes come and go.
Shard = tuple[int, int]


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    gpus: int
    model: GPUModel
    #: Pods per GPU (the device plugin's time-slicing replicas): the node advertises gpus x slices
    #: nvidia.com/gpu, device d is a share of GPU d // slices, and a GPU's series are repeated for
    #: each pod on it, as dcgm-exporter attributes a shared GPU to every pod using it.
    slices: int = 1
    #: The dcgm-exporter generation serving this node; None: the simulator's (``SimOptions.exporter``).
    exporter: Generation | None = None

    @property
    def devices(self) -> int:
        """nvidia.com/gpu the node advertises."""
        return self.gpus * self.slices


@dataclass(frozen=True, slots=True)
class WorkloadPlay:
    """What a workload's GPUs do over time: a profile, profile switches, explicit metric values."""

    namespace: str
    name: str
    profile: str = "idle"
    changes: tuple[tuple[float, str], ...] = ()  # (at seconds, profile), sorted by time
    timeline: tuple[tuple[float, Mapping[str, float | None]], ...] = ()  # (at, values); None unsets

    def profile_at(self, t: float) -> str:
        current = self.profile
        for at, name in self.changes:
            if at <= t:
                current = name
        return current

    def overrides_at(self, t: float) -> dict[str, float]:
        """Timeline values in effect at t: later entries merge over earlier ones."""
        merged: dict[str, float] = {}
        for at, values in self.timeline:
            if at > t:
                break
            for metric, value in values.items():
                if value is None:
                    merged.pop(metric, None)
                else:
                    merged[metric] = value
        return merged


@dataclass(frozen=True, slots=True)
class SimOptions:
    pod_labels: PodLabels = PodLabels.STANDARD
    sm_active: bool = True  # False: the exporter's default CSV (no SM_ACTIVE, occupancy, tensor, DRAM...)
    #: The clock-event metric name for every node; None: the generation's (the old name on legacy).
    clock_events_metric: str | None = None
    #: The dcgm-exporter generation of nodes that name none (``exporter_fields.Generation``).
    exporter: Generation = DEFAULT_EXPORTER
    driver_version: str = "550.90.07"
    default_profile: str = "compute-bound"  # attributed pods that no workload or annotation describes


class _GPU:
    """Mutable per-GPU state: identity, attribution and the integrating counters."""

    __slots__ = ("clock_event_seconds", "energy_mj", "energy_reset_at", "gen", "holders", "index", "labels",
                 "last_t", "model", "node", "node_hash", "nvlink_total", "pci_bus_id", "prefixes", "seed",
                 "served", "uuid")  # fmt: skip

    def __init__(self, node: str, index: int, model: GPUModel, gen: Presentation) -> None:
        self.node = node
        self.index = index
        self.model = model
        self.gen = gen
        # the served name per exposed metric position ("" where this generation does not serve it)
        self.served: tuple[str, ...] = ()
        # clock-event bit -> the whole seconds it was seen set (DCGM_EXP_CLOCK_EVENTS_COUNT's window)
        self.clock_event_seconds: dict[int, list[int]] = {}
        self.seed = seed_for(node, index)
        self.node_hash = seed_for(node)
        self.uuid = "GPU-" + str(uuidlib.UUID(int=self.seed << 64 | seed_for(node, index, "uuid")))
        self.pci_bus_id = f"00000000:{0x18 + 0x10 * index:02X}:00.0"
        self.holders: tuple[Holder, ...] = ()  # more than one on a time-sliced GPU
        self.labels: tuple[str, ...] = ()  # one label set per holder (one without pod labels when free)
        # "NAME{labels} " per exposed metric, per label set; rebuilt with the labels
        self.prefixes: tuple[tuple[str, ...], ...] = ()
        self.energy_mj = 1.0e10 + 4.0e10 * uniform(self.seed, 0, 99)
        self.nvlink_total = 0.0
        self.energy_reset_at = float("-inf")
        self.last_t: float | None = None


@dataclass
class _Frame:
    t: float
    text: str


@dataclass
class _ShardCache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    frame: _Frame | None = None


class Simulator:
    """Thread-safe: watchers call ``set_pods``/``set_nodes`` while HTTP threads call ``render``."""

    def __init__(
        self,
        nodes: Iterable[SimNode] = (),
        *,
        workloads: Iterable[WorkloadPlay] = (),
        faults: Iterable[Fault] = (),
        options: SimOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options or SimOptions()
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.RLock()
        self._workloads = {(w.namespace, w.name): w for w in workloads}
        self._faults: tuple[Fault, ...] = ()
        self._global_faults: tuple[Fault, ...] = ()
        self._faults_by_node: dict[str, tuple[Fault, ...]] = {}
        self._index_faults(faults)
        self._allocator = GPUAllocator()
        self._pods: tuple[PodInfo, ...] = ()
        self._claims: dict[str, tuple[int, ...]] = {}  # pod UID -> DRA GPU indexes allocated
        self._nodes: dict[str, SimNode] = {}
        self._gpus: dict[tuple[str, int], _GPU] = {}
        self._order: list[_GPU] = []
        self._shards: dict[Shard | None, _ShardCache] = {}
        self._metrics = [
            m
            for m in catalog.METRICS
            if self.options.sm_active or m.name not in catalog.OFF_WITHOUT_SM_ACTIVE
        ]
        self._headers: dict[str, str] = {}  # served name -> its HELP/TYPE lines
        self.set_nodes(nodes)

    # ---- clock ---------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Seconds since the simulator (scenario) clock started."""
        return self._clock() - self._t0

    def restart_clock(self) -> None:
        """Make now t=0 (the runner calls this when the scenario's workloads are submitted)."""
        self._t0 = self._clock()

    # ---- inputs --------------------------------------------------------------------------------

    def set_nodes(self, nodes: Iterable[SimNode]) -> None:
        with self._lock:
            self._nodes = {n.name: n for n in nodes}
            gpus: dict[tuple[str, int], _GPU] = {}
            for node in self._nodes.values():
                gen = presentation(node.exporter or self.options.exporter)
                for index in range(node.gpus):
                    old = self._gpus.get((node.name, index))
                    gpus[(node.name, index)] = (
                        old
                        if old is not None and old.model == node.model and old.gen is gen
                        else _GPU(node.name, index, node.model, gen)
                    )
            self._gpus = gpus
            self._order = [gpus[k] for k in sorted(gpus)]
            self._attribute()

    def add_faults(self, injections: Iterable[Fault]) -> None:
        """Inject faults while running (a benchmark choosing its injection times as it goes).

        Times are on the simulator clock: ``Fault(kind, at=sim.elapsed(), ...)`` takes effect with
        the next render. Faults already given stay; counters add up as if all had been given at once.
        """
        with self._lock:
            self._index_faults((*self._faults, *injections))

    def _index_faults(self, injections: Iterable[Fault]) -> None:
        """Replace the fault tables as a whole: renders read them without the lock."""
        ordered = tuple(sorted(injections, key=lambda f: f.at))
        by_node: dict[str, tuple[Fault, ...]] = {}
        for f in ordered:
            if f.node is not None:
                by_node[f.node] = (*by_node.get(f.node, ()), f)
        self._faults = ordered
        self._faults_by_node = by_node
        self._global_faults = tuple(f for f in ordered if f.node is None)

    def set_pods(self, pods: Iterable[PodInfo]) -> None:
        with self._lock:
            self._pods = tuple(pods)
            self._attribute()

    def set_claims(self, devices: Mapping[str, tuple[int, ...]]) -> None:
        """The DRA GPU indexes allocated to each pod's ResourceClaims (``allocation.claim_devices``)."""
        with self._lock:
            if dict(devices) == self._claims:
                return
            self._claims = dict(devices)
            self._attribute()

    def _attribute(self) -> None:
        slices = {n.name: n.slices for n in self._nodes.values()}
        pods = [replace(p, devices=self._claims.get(p.uid, ())) if p.dra else p for p in self._pods]
        held = self._allocator.update({n.name: n.devices for n in self._nodes.values()}, pods)
        by_gpu: dict[tuple[str, int], list[Holder]] = {}
        for (node, device), holder in sorted(held.items(), key=lambda kv: kv[0]):
            tenants = by_gpu.setdefault((node, device // slices[node]), [])
            if holder not in tenants:  # a pod with two shares of one GPU is one tenant
                tenants.append(holder)
        for key, gpu in self._gpus.items():
            holders = tuple(by_gpu.get(key, ()))
            if holders != gpu.holders or not gpu.labels:
                gpu.holders = holders
                gpu.served = tuple(self._served_name(gpu.gen, m.name) for m in self._metrics)
                gpu.labels = tuple(
                    gpu_labels(
                        index=gpu.index,
                        uuid=gpu.uuid,
                        pci_bus_id=gpu.pci_bus_id,
                        model_name=gpu.model.model_name,
                        hostname=gpu.node,
                        driver_version=self.options.driver_version,
                        holder=holder,
                        pod_labels=self.options.pod_labels,
                        node_label=gpu.gen.node_label,
                    )
                    for holder in (holders or (None,))
                )
                gpu.prefixes = tuple(
                    tuple(f"{served}{{{labels}}} " if served else "" for served in gpu.served)
                    for labels in gpu.labels
                )

    # ---- queries -------------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[SimNode, ...]:
        with self._lock:
            return tuple(self._nodes.values())

    def holders(self) -> dict[tuple[str, int], tuple[Holder, ...]]:
        """(node, GPU index) -> the pods (containers) holding it: one, or several on a time-sliced GPU."""
        with self._lock:
            return {k: g.holders for k, g in self._gpus.items() if g.holders}

    def uuid_of(self, node: str, index: int) -> str:
        return self._gpus[(node, index)].uuid

    def profile_of(self, holders: tuple[Holder, ...], t: float) -> tuple[str, dict[str, float]]:
        """The profile a GPU plays at t and the timeline values overriding it: its pod's, or on a
        time-sliced GPU the first of its pods' that does work (a busy tenant keeps the GPU busy)."""
        plays = [self._play(h, t) for h in holders]
        return next((p for p in plays if p[0] not in _RESTING), plays[0] if plays else (FREE_GPU_PROFILE, {}))

    def _play(self, holder: Holder, t: float) -> tuple[str, dict[str, float]]:
        pod = holder.pod
        named = pod.annotations.get(PROFILE_ANNOTATION, "")
        if named in profiles.PROFILES:  # the pod's own profile: one replica unlike the others
            return named, {}
        play = self._workloads.get((pod.namespace, pod.labels.get(WORKLOAD_LABEL, "")))
        if play is not None:
            return play.profile_at(t), play.overrides_at(t)
        return self.options.default_profile, {}

    def down(self, t: float | None = None) -> Fault | None:
        """The exporter-down fault in effect now (or at t)."""
        return faults.exporter_down(self._global_faults, self.elapsed() if t is None else t)

    def gpu_values(self, node: str, index: int, t: float | None = None) -> dict[str, Reading] | None:
        """Readings of one GPU at t (default now), faults applied; None while its series are gapped."""
        gpu = self._gpus[(node, index)]
        return self._values(gpu, self.elapsed() if t is None else t)

    def _values(self, gpu: _GPU, t: float) -> dict[str, Reading] | None:
        name, overrides = self.profile_of(gpu.holders, t)
        values = profiles.sample(name, t, gpu.seed, gpu.model)
        self._integrate(gpu, values, t)
        values.update(_HEALTHY)
        if overrides:
            values.update(overrides)
        node_faults = self._faults_by_node.get(gpu.node, ())
        if not node_faults and not self._global_faults:
            return dict(values)
        applied = faults.apply(values, node_faults + self._global_faults, gpu.node, gpu.index, t)
        if applied is None:
            return None
        # NaN/Inf from garbage faults, spelt as the text format wants (repr would give "nan").
        return {k: format_value(v) if not math.isfinite(v) else v for k, v in applied.items()}

    def _integrate(self, gpu: _GPU, values: dict[str, float], t: float) -> None:
        """Advance the energy and NVLink counters; honour counter resets."""
        if gpu.last_t is not None and t > gpu.last_t:
            dt = t - gpu.last_t
            gpu.energy_mj += float(values[Signal.POWER]) * dt * 1000.0
            gpu.nvlink_total += (values[Signal.NVLINK_RX_BYTES] + values[Signal.NVLINK_TX_BYTES]) * dt / 1e6
        if gpu.last_t is None or t > gpu.last_t:
            gpu.last_t = t
        reset = faults.last_counter_reset(
            self._faults_by_node.get(gpu.node, ()) + self._global_faults,
            gpu.node,
            gpu.index,
            catalog.ENERGY,
            t,
        )
        if reset > gpu.energy_reset_at:
            gpu.energy_reset_at = reset
            gpu.energy_mj = 0.0
            gpu.nvlink_total = 0.0
        values[catalog.ENERGY] = int(gpu.energy_mj)
        values[catalog.NVLINK_BANDWIDTH_TOTAL] = int(gpu.nvlink_total)

    # ---- exposition ----------------------------------------------------------------------------

    def _served_name(self, gen: Presentation, name: str) -> str:
        """The name ``gen`` serves ``name`` under; "" when it does not serve it."""
        if not gen.serves(name):
            return ""
        if name == catalog.CLOCK_EVENTS_NEW and self.options.clock_events_metric:
            return self.options.clock_events_metric
        return gen.name(name)

    def _header(self, served: str, position: int, gen: Presentation) -> str:
        text = self._headers.get(served)
        if text is None:
            metric = self._metrics[position]
            text = self._headers[served] = header(served, metric.type, gen.help(metric.name, metric.help))
        return text

    def render(self, shard: Shard | None = None, t: float | None = None) -> str:
        """The /metrics text of one shard's nodes (default all) at t (default now)."""
        t = self.elapsed() if t is None else t
        with self._lock:
            gpus = [g for g in self._order if shard is None or g.node_hash % shard[1] == shard[0]]
        rows: list[tuple[tuple[str, ...], dict[str, Reading], _GPU]] = []
        counted: list[tuple[_GPU, dict[str, Reading]]] = []
        for gpu in gpus:
            values = self._values(gpu, t)
            if values is None:
                continue
            if gpu.gen.scale:
                values = _scaled(values, gpu.gen)
            rows.extend((prefixes, values, gpu) for prefixes in gpu.prefixes)
            if gpu.gen.counts:
                counted.append((gpu, values))
        out: list[str] = []
        for position, metric in enumerate(self._metrics):
            name = metric.name
            # One family per served name: a mixed fleet serves one reading under two names.
            families: dict[str, list[str]] = {}
            # str(int) and repr(float) are already the text format; NaN/Inf arrive as strings.
            for prefixes, values, gpu in rows:
                v = values.get(name)
                if v is not None and prefixes[position]:
                    served = gpu.served[position]
                    lines = families.get(served)
                    if lines is None:
                        lines = families[served] = [self._header(served, position, gpu.gen)]
                    lines.append(f"{prefixes[position]}{v}\n")
            for lines in families.values():
                out.extend(lines)
        if counted:
            out.extend(self._counts(counted, t))
        return "".join(out)

    def _counts(self, counted: list[tuple[_GPU, dict[str, Reading]]], t: float) -> list[str]:
        """DCGM_EXP_XID_ERRORS_COUNT and DCGM_EXP_CLOCK_EVENTS_COUNT, as dcgm-exporter's exp collectors
        write them: per GPU, one series per XID (clock event) seen in the window, valued by how often it
        was seen; one series valued 0 without the ``xid`` (``clock_event``) label when none was."""
        window = COUNT_WINDOW_MS / 1000.0
        xid_lines: list[str] = []
        clock_lines: list[str] = []
        for gpu, values in counted:
            xids: dict[int, int] = {}
            for f in self._faults_by_node.get(gpu.node, ()) + self._global_faults:
                if f.kind is FaultKind.XID and f.hits(gpu.node, gpu.index) and t - window < f.at <= t:
                    xid = int(f.value) if isinstance(f.value, int | float) else 79
                    xids[xid] = xids.get(xid, 0) + 1
            events = self._clock_event_counts(gpu, values, t, window)
            for labels in gpu.labels:
                seen: list[tuple[int | None, int]] = [*sorted(xids.items())] or [(None, 0)]
                for code, n in seen:
                    extra = xid_count_labels(COUNT_WINDOW_MS, code)
                    xid_lines.append(f"{XID_COUNT}{{{labels}{extra}}} {n}\n")
                for event, n in sorted(events.items()) or [("", 0)]:
                    extra = clock_event_count_labels(COUNT_WINDOW_MS, event)
                    clock_lines.append(f"{CLOCK_EVENTS_COUNT}{{{labels}{extra}}} {n}\n")
        return [
            header(XID_COUNT, "counter", "Count of XID Errors within user-specified time window."),
            *xid_lines,
            header(
                CLOCK_EVENTS_COUNT, "counter", "Count of clock events within the user-specified time window."
            ),
            *clock_lines,
        ]

    @staticmethod
    def _clock_event_counts(gpu: _GPU, values: dict[str, Reading], t: float, window: float) -> dict[str, int]:
        """Seconds in the window each clock-event bit was seen set, by dcgm-exporter's label value.

        The exporter counts the field's samples in the window; the simulator samples once a second, at
        the renders (scrapes), so a bit set for 20 s of the last five minutes counts 20."""
        raw = values.get(catalog.CLOCK_EVENTS_NEW)
        bits = int(raw) if isinstance(raw, int | float) and math.isfinite(raw) else 0
        second = int(t)
        for bit in CLOCK_EVENT_LABELS:
            if bits & bit:
                seen = gpu.clock_event_seconds.setdefault(bit, [])
                if not seen or seen[-1] < second:
                    seen.append(second)
        counts: dict[str, int] = {}
        for bit, seen in gpu.clock_event_seconds.items():
            while seen and seen[0] <= t - window:
                seen.pop(0)
            if seen:
                counts[CLOCK_EVENT_LABELS[bit]] = len(seen)
        return counts

    def render_cached(self, shard: Shard | None = None, max_age: float = 0.5) -> str:
        """``render`` shared by the scrapes of one shard that arrive within ``max_age`` seconds."""
        with self._lock:
            cache = self._shards.setdefault(shard, _ShardCache())
        with cache.lock:
            now = self.elapsed()
            if cache.frame is None or now - cache.frame.t >= max_age or now < cache.frame.t:
                cache.frame = _Frame(now, self.render(shard, now))
            return cache.frame.text


def _scaled(values: dict[str, Reading], gen: Presentation) -> dict[str, Reading]:
    """``values`` in ``gen``'s units (a copy): integers stay integers where the factor is at least 1."""
    out = dict(values)
    for name, factor in gen.scale.items():
        v = out.get(name)
        if isinstance(v, int | float):
            scaled = v * factor
            out[name] = round(scaled) if factor >= 1 and float(v).is_integer() else round(scaled, 9)
    return out


#: Fault fields of a healthy GPU; fault injections change them.
_HEALTHY: Final[dict[str, float]] = {
    catalog.PCIE_REPLAY: 0,
    Signal.XID: 0,
    catalog.ECC_SBE_VOLATILE: 0,
    Signal.ECC_DBE_VOLATILE: 0,
    Signal.RETIRED_PAGES_PENDING: 0,
    catalog.REMAPPED_ROWS_CORRECTABLE: 0,
    Signal.REMAPPED_ROWS_UNCORRECTABLE: 0,
    Signal.ROW_REMAP_FAILURE: 0,
}
