"""Which metric samples to believe (safety rule 8: trust no label alone).

Any tenant whose pods the same Prometheus scrapes can publish series with any labels. A sample's
pod labels therefore count only where the pod really runs on the sample's node (``spec.nodeName``),
and a node's fault evidence only while the GPUs reported on the node are GPUs it can have: the
exporter reports every GPU of its node, so more distinct GPUs than the node's GPU capacity means
at least one is invented, and as it cannot be told which, none of that node's fault windows are
believed (no new taint; the GPUs' fault judgements are Unknown). Dropped samples are counted by
reason for the policy status and the operator's metrics (``DropReason``: every reason, sources'
included). Where Prometheus and a node agent both report a GPU, ``merge_samples`` decides which
sample the engine judges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from gpu_efficiency.engine.model import GPUSample, NodeView, PodView, Signal, Window
from gpu_efficiency.engine.reclaim.activity import ACTIVITY_CHAIN, CONTRADICTION_UTIL, MAX_SMS_PER_GPU


class DropReason(StrEnum):
    """Why a sample, series or attribution was not believed: the metric label values and the status
    keys of every drop, by the sources (decoding) and the engine (vetting, merging) alike."""

    #: A series whose GPU identifier has none of the shapes a GPU id has (sources/metrics/labels.py).
    INVALID_ID = "invalid-gpu-id"
    #: A GPU whose series name more than one node (a GPU is on one node: at least one series lies;
    #: where no agent says which, none is believed), or that Prometheus places elsewhere than its agent.
    NODE_CONFLICT = "node-conflict"
    #: A pod attribution whose GPU is reported on another node than the one the pod runs on.
    POD_NODE_MISMATCH = "pod-node-mismatch"
    #: Fault windows of a GPU on a node reporting more GPUs than its capacity.
    GPUS_EXCEED_CAPACITY = "gpus-exceed-capacity"
    #: A Prometheus sample whose activity its GPU's agent contradicts.
    CONTRADICTS_AGENT = "contradicts-agent"
    #: A GPU no scrape target on its own node reports (identity from elsewhere; sources/metrics/targets.py).
    IDENTITY_OFF_NODE = "identity-off-node"
    #: A fault window's series from a target that does not report the GPU on its node.
    FAULT_OFF_TARGET = "fault-off-target"


class Tally(Protocol):
    """Where drops are counted by reason (the sources' thread-safe ``DropTally``)."""

    def add(self, reason: str, count: int = 1) -> None: ...


#: Windows that carry fault evidence (faults.FAULT_WINDOWS; repeated: faults imports the planner's peers).
_FAULT_WINDOWS = frozenset((Window.FAULT, Window.THERMAL_HOLD, Window.THERMAL_RECOVERY))


@dataclass(frozen=True, slots=True)
class Vetted:
    """The samples the engine may believe, and what was dropped from them, by reason."""

    gpus: tuple[GPUSample, ...]
    dropped: Mapping[str, int]


def physical_gpu(uuid: str) -> str:
    """The physical GPU of a sample's id (a MIG instance's id is ``<GPU UUID>/<instance>``)."""
    return uuid.split("/", 1)[0]


def _overfull_nodes(gpus: Sequence[GPUSample], nodes: Iterable[NodeView]) -> set[str]:
    """Nodes reporting more distinct physical GPUs than their GPU capacity. Nodes with MIG
    instances are not judged: MIG-partitioned GPUs are not counted in ``nvidia.com/gpu``."""
    capacity = {n.name: n.gpu_capacity for n in nodes if n.gpu_capacity > 0}
    seen: dict[str, set[str]] = {}
    mig: set[str] = set()
    for gpu in gpus:
        node = gpu.node
        if node not in capacity:
            continue
        uuid = gpu.uuid
        if "/" in uuid:
            mig.add(node)
            uuid = physical_gpu(uuid)
        found = seen.get(node)
        if found is None:
            seen[node] = {uuid}
        else:
            found.add(uuid)
    return {node for node, found in seen.items() if node not in mig and len(found) > capacity[node]}


def vet_samples(gpus: Sequence[GPUSample], pods: Iterable[PodView], nodes: Iterable[NodeView]) -> Vetted:
    """``gpus`` without the pod attributions and fault windows that contradict the cluster (see the
    module docstring). Attributions to pods the snapshot does not hold are kept: no verdict is made
    for them, and dropping them would hide a co-tenant from the sharing rule."""
    pod_nodes = {(p.namespace, p.name): p.node for p in pods}
    overfull: set[str] | None = None  # counted once a GPU has a fault window (most have none)
    dropped: dict[str, int] = {}
    out: list[GPUSample] = []
    for gpu in gpus:
        node = gpu.node
        refs = gpu.pods
        kept = refs
        for ref in refs:  # the common case, every attribution on its node, builds no new tuple
            if pod_nodes.get((ref.namespace, ref.name), node) != node:
                kept = tuple([r for r in refs if pod_nodes.get((r.namespace, r.name), node) == node])
                break
        stats = gpu.stats
        if not _FAULT_WINDOWS.isdisjoint(stats):
            if overfull is None:
                overfull = _overfull_nodes(gpus, nodes)
            if node in overfull:
                stats = {w: s for w, s in stats.items() if w not in _FAULT_WINDOWS}
                dropped[DropReason.GPUS_EXCEED_CAPACITY] = dropped.get(DropReason.GPUS_EXCEED_CAPACITY, 0) + 1
        if len(kept) != len(gpu.pods):
            dropped[DropReason.POD_NODE_MISMATCH] = (
                dropped.get(DropReason.POD_NODE_MISMATCH, 0) + len(gpu.pods) - len(kept)
            )
        out.append(gpu if kept is refs and stats is gpu.stats else replace(gpu, pods=kept, stats=stats))
    return Vetted(gpus=tuple(out), dropped=dropped)


def merged_counts(*tallies: Mapping[str, int]) -> dict[str, int]:
    """Counts by reason, summed; sorted by reason so the status reads the same every cycle."""
    out: dict[str, int] = {}
    for tally in tallies:
        for reason, count in tally.items():
            out[reason] = out.get(reason, 0) + count
    return {reason: out[reason] for reason in sorted(out) if out[reason] > 0}


# ---- merging the Prometheus and node-agent samples of one GPU ----------------------------------------

_ACTIVITY_RANK = (Signal.GPU_UTIL, Signal.GR_ENGINE_ACTIVE, Signal.SM_ACTIVE)  # worst to best


def _quality(sample: GPUSample, now: float, max_staleness: float) -> tuple[bool, int, float, float]:
    """(fresh, best activity signal, its coverage, newest timestamp): larger is better."""
    activity = sample.stats.get(Window.ACTIVITY, {})
    newest = max(
        (s.last_timestamp for s in activity.values() if math.isfinite(s.last_timestamp)), default=-math.inf
    )
    rank, coverage = 0, 0.0
    for i, signal in enumerate(_ACTIVITY_RANK, start=1):
        stats = activity.get(signal)
        if stats is not None and stats.count > 0:
            expected = sample.expected_samples.get(Window.ACTIVITY) or stats.count
            rank, coverage = i, min(1.0, stats.count / expected)
    return newest >= now - max_staleness, rank, round(coverage, 2), newest


def merge_samples(
    prometheus: Iterable[GPUSample],
    agent: Iterable[GPUSample],
    *,
    now: float,
    max_staleness: float,
    drops: Tally | None = None,
) -> list[GPUSample]:
    """One sample per GPU (UUID): the fresh one first, then the better activity signal (SM active over
    GR engine over GPU util), then coverage, then the newest; a tie goes to the agent. Samples are kept
    whole (never mixed signal by signal: their sample densities differ); ``source`` tells which won.
    Where Prometheus places a GPU on another node than its agent (``NODE_CONFLICT``), or reads it less
    active than the agent's fresh busy reading allows (``CONTRADICTS_AGENT``), the agent's sample is
    taken and the Prometheus one counted in ``drops``. Where the agent's fault window holds a fault
    reading Prometheus has not scraped yet (``_fault_news``), the agent's sample is taken too: the
    fault is judged now, not after the next scrape. Where both are kept, the other one rides along
    as the sample's ``witness``: a drain or NoExecute needs both to show the fault (safety rule 9)."""
    chosen: dict[str, GPUSample] = {g.uuid: g for g in prometheus}
    for g in agent:
        other = chosen.get(g.uuid)
        if other is not None and other.node != g.node:
            # The agent reads the GPU through NVML on its own node; a Prometheus series placing
            # the same GPU on another node is wrong (or forged) and never wins (safety rule 8).
            chosen[g.uuid] = g
            if drops is not None:
                drops.add(DropReason.NODE_CONFLICT)
        elif other is not None and _contradicts_agent(other, g, now - max_staleness):
            # Prometheus' activity is below what the agent's fresh reading of the same GPU says its
            # kernels physically imply: believe the agent, which reads NVML on the node itself.
            chosen[g.uuid] = g
            if drops is not None:
                drops.add(DropReason.CONTRADICTS_AGENT)
        elif other is None:
            chosen[g.uuid] = g
        elif _fault_news(g, other, now - max_staleness) or _quality(g, now, max_staleness) >= _quality(
            other, now, max_staleness
        ):
            chosen[g.uuid] = replace(g, witness=other)
        else:
            chosen[g.uuid] = replace(other, witness=g)
    return sorted(chosen.values(), key=lambda g: (g.node, g.index, g.uuid))


#: Fault signals the agent reads from NVML events and counters as they happen.
_FAULT_SIGNALS = (
    Signal.XID,
    Signal.ECC_DBE_VOLATILE,
    Signal.REMAPPED_ROWS_UNCORRECTABLE,
    Signal.ROW_REMAP_FAILURE,
)


def _fault_news(agent: GPUSample, prometheus: GPUSample, oldest: float) -> bool:
    """Does the agent's fresh fault window show a change (a new XID, an ECC counter step) whose value
    Prometheus' samples, all older than the agent's newest, do not hold yet? A Prometheus sample as
    new as the agent's with another value contradicts it: then neither is preferred for it."""
    for signal in _FAULT_SIGNALS:
        mine = agent.get(Window.FAULT, signal)
        if mine is None or mine.changes <= 0 or not mine.last_timestamp >= oldest:
            continue
        theirs = prometheus.get(Window.FAULT, signal)
        if theirs is None or (theirs.last != mine.last and theirs.last_timestamp < mine.last_timestamp):
            return True
    return False


def _kernel_share(sample: GPUSample, oldest: float) -> float:
    """The largest fresh share of the window a kernel ran on this GPU by its own readings (GPU_UTIL,
    and SM / GR engine activity, which cannot exceed it); 0 when none is known."""
    activity = sample.stats.get(Window.ACTIVITY, {})
    share = 0.0
    for signal, _, scale in ACTIVITY_CHAIN:
        stats = activity.get(signal)
        if stats is not None and stats.count > 0 and stats.last_timestamp >= oldest:
            value = stats.avg * scale
            if math.isfinite(value) and value > share:
                share = min(value, 1.0)
    return share


def _contradicts_agent(prometheus: GPUSample, agent: GPUSample, oldest: float) -> bool:
    """Does the agent's fresh reading say kernels ran (CONTRADICTION_UTIL of the window or more)
    while Prometheus' best activity signal stays below what that implies (``contradiction``'s
    physical bound: at least one SM of at most MAX_SMS_PER_GPU busy while a kernel runs)?"""
    share = _kernel_share(agent, oldest)
    if share < CONTRADICTION_UTIL:
        return False
    activity = prometheus.stats.get(Window.ACTIVITY, {})
    for signal, _, scale in ACTIVITY_CHAIN:  # the signal the engine would judge Prometheus' sample by
        stats = activity.get(signal)
        if stats is not None and stats.count > 0:
            return not stats.avg * scale >= share / MAX_SMS_PER_GPU  # NaN contradicts too
    return False
