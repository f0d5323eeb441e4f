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

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog, faults, profiles
from gpu_efficiency_sim.allocation import GPUAllocator, Holder, PodInfo
from gpu_efficiency_sim.exposition import PodLabels, Reading, format_value, gpu_labels, header
from gpu_efficiency_sim.faults import Fault
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
    clock_events_metric: str = catalog.CLOCK_EVENTS_NEW  # or catalog.CLOCK_EVENTS_OLD
    driver_version: str = "550.90.07"
    default_profile: str = "compute-bound"  # attributed pods that no workload or annotation describes


class _GPU:
    """Mutable per-GPU state: identity, attribution and the integrating counters."""

    __slots__ = ("energy_mj", "energy_reset_at", "holders", "index", "labels", "last_t", "model", "node",
                 "node_hash", "nvlink_total", "pci_bus_id", "prefixes", "seed", "uuid")  # fmt: skip

    def __init__(self, node: str, index: int, model: GPUModel) -> None:
        self.node = node
        self.index = index
        self.model = model
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
        self._headers = {m.name: header(self._exposed_name(m.name), m.type, m.help) for m in self._metrics}
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
                for index in range(node.gpus):
                    old = self._gpus.get((node.name, index))
                    gpus[(node.name, index)] = (
                        old
                        if old is not None and old.model == node.model
                        else _GPU(node.name, index, node.model)
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
                    )
                    for holder in (holders or (None,))
                )
                gpu.prefixes = tuple(
                    tuple(f"{self._exposed_name(m.name)}{{{labels}}} " for m in self._metrics)
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

    def _exposed_name(self, name: str) -> str:
        if name == catalog.CLOCK_EVENTS_NEW:
            return self.options.clock_events_metric
        return name

    def render(self, shard: Shard | None = None, t: float | None = None) -> str:
        """The /metrics text of one shard's nodes (default all) at t (default now)."""
        t = self.elapsed() if t is None else t
        with self._lock:
            gpus = [g for g in self._order if shard is None or g.node_hash % shard[1] == shard[0]]
        rows: list[tuple[tuple[str, ...], dict[str, Reading]]] = []
        for gpu in gpus:
            values = self._values(gpu, t)
            if values is not None:
                rows.extend((prefixes, values) for prefixes in gpu.prefixes)
        out: list[str] = []
        for position, metric in enumerate(self._metrics):
            name = metric.name
            # str(int) and repr(float) are already the text format; NaN/Inf arrive as strings.
            lines = [
                f"{prefixes[position]}{v}\n"
                for prefixes, values in rows
                if (v := values.get(name)) is not None
            ]
            if lines:
                out.append(self._headers[name])
                out.extend(lines)
        return "".join(out)

    def render_cached(self, shard: Shard | None = None, max_age: float = 0.5) -> str:
        """``render`` shared by the scrapes of one shard that arrive within ``max_age`` seconds."""
        with self._lock:
            cache = self._shards.setdefault(shard, _ShardCache())
        with cache.lock:
            now = self.elapsed()
            if cache.frame is None or now - cache.frame.t >= max_age or now < cache.frame.t:
                cache.frame = _Frame(now, self.render(shard, now))
            return cache.frame.text


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
