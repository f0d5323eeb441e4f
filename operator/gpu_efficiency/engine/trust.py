"""Which metric samples to believe (safety rule 9: trust no label alone).

Any tenant whose pods the same Prometheus scrapes can publish series with any labels. A sample's
pod labels therefore count only where the pod really runs on the sample's node (``spec.nodeName``),
and a node's fault evidence only while the GPUs reported on the node are GPUs it can have: the
exporter reports every GPU of its node, so more distinct GPUs than the node's GPU capacity means
at least one is invented, and as it cannot be told which, none of that node's fault windows are
believed (no new taint; the GPUs' fault judgements are Unknown). Dropped samples are counted by
reason for the policy status and the operator's metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpu_efficiency.engine.model import GPUSample, NodeView, PodView, Window

#: A pod attribution whose GPU is reported on another node than the one the pod runs on.
POD_NODE_MISMATCH = "pod-node-mismatch"
#: Fault windows of a GPU on a node reporting more GPUs than its capacity.
GPUS_EXCEED_CAPACITY = "gpus-exceed-capacity"
#: Windows that carry fault evidence (faults.FAULT_WINDOWS; repeated: faults imports the planner's peers).
_FAULT_WINDOWS = (Window.FAULT, Window.THERMAL_HOLD, Window.THERMAL_RECOVERY)


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
    overfull = _overfull_nodes(gpus, nodes)
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
        if gpu.node in overfull and any(w in stats for w in _FAULT_WINDOWS):
            stats = {w: s for w, s in stats.items() if w not in _FAULT_WINDOWS}
            dropped[GPUS_EXCEED_CAPACITY] = dropped.get(GPUS_EXCEED_CAPACITY, 0) + 1
        if len(kept) != len(gpu.pods):
            dropped[POD_NODE_MISMATCH] = dropped.get(POD_NODE_MISMATCH, 0) + len(gpu.pods) - len(kept)
        out.append(gpu if kept is refs and stats is gpu.stats else replace(gpu, pods=kept, stats=stats))
    return Vetted(gpus=tuple(out), dropped=dropped)


def merged_counts(*tallies: Mapping[str, int]) -> dict[str, int]:
    """Counts by reason, summed; sorted by reason so the status reads the same every cycle."""
    out: dict[str, int] = {}
    for tally in tallies:
        for reason, count in tally.items():
            out[reason] = out.get(reason, 0) + count
    return {reason: out[reason] for reason in sorted(out) if out[reason] > 0}
