"""Which GPU index of a node each pod holds, handed out the way the device plugin would.

The simulator sees pods through the API, not through the kubelet, so it has to invent the device
assignment. Rules that keep it believable and testable:

- a pod keeps its GPUs while it lives (no reshuffling when neighbours come and go);
- new pods get the lowest free indexes, in order of (creationTimestamp, uid), so a restarted
  simulator reproduces the assignment of pods that were admitted in that order;
- pods that finished (Succeeded/Failed) or disappeared release their GPUs;
- a pod whose GPUs are DRA devices holds exactly the devices its ResourceClaims were allocated
  (``claim_devices``: the scheduler chose them), not invented ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_efficiency.api.names import GPU_RESOURCE

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: The simulated DRA driver (NVIDIA's name) and its device names: gpu-<index>.
DRA_DRIVER = "gpu.nvidia.com"
DRA_DEVICE_PREFIX = "gpu-"
_DRA_DEVICE = re.compile(rf"^{DRA_DEVICE_PREFIX}(\d+)$")


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The few pod fields attribution needs."""

    namespace: str
    name: str
    uid: str
    node: str
    created: str  # RFC3339: sorts chronologically as text
    containers: tuple[tuple[str, int], ...]  # (container name, GPUs) for containers requesting GPUs
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    phase: str = "Running"
    deleting: bool = False
    dra: bool = False  # its GPUs come from ResourceClaims (containers then count 0 GPUs)
    devices: tuple[int, ...] = ()  # DRA: the GPU indexes its claims were allocated

    @property
    def gpus(self) -> int:
        return len(self.devices) if self.dra else sum(n for _, n in self.containers)

    @property
    def active(self) -> bool:
        return bool(self.node) and self.phase not in TERMINAL_PHASES and self.gpus > 0


@dataclass(frozen=True, slots=True)
class Holder:
    """The pod and container a GPU is attributed to."""

    pod: PodInfo
    container: str


def _gpu_count(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get(GPU_RESOURCE)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo | None:
    """A PodInfo from a pod as the API serves it (JSON), or None when it holds no GPU."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    containers = tuple(
        (str(c.get("name", "")), n) for c in spec.get("containers") or () if (n := _gpu_count(c)) > 0
    )
    dra = not containers and bool(spec.get("resourceClaims"))
    if dra:
        containers = tuple(
            (str(c.get("name", "")), 0)
            for c in spec.get("containers") or ()
            if (c.get("resources") or {}).get("claims")
        )
    if not containers:
        return None
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        containers=containers,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        dra=dra,
    )


def claim_devices(claims: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """Pod UID -> the simulated driver's GPU indexes allocated to the claims it has reserved."""
    out: dict[str, set[int]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        indexes = {
            int(m.group(1))
            for r in results
            if r.get("driver") == DRA_DRIVER and (m := _DRA_DEVICE.match(str(r.get("device", ""))))
        }
        for ref in status.get("reservedFor") or ():
            if ref.get("resource") == "pods" and ref.get("uid"):
                out.setdefault(str(ref["uid"]), set()).update(indexes)
    return {uid: tuple(sorted(i)) for uid, i in out.items()}


class GPUAllocator:
    """Keeps the pod -> GPU index assignment of every node across updates."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, list[tuple[int, str]]]] = {}  # node -> uid -> [(index, container)]

    def update(self, node_gpus: Mapping[str, int], pods: Iterable[PodInfo]) -> dict[tuple[str, int], Holder]:
        """Fold in the current pods; return (node, GPU index) -> holder for every held GPU."""
        by_node: dict[str, list[PodInfo]] = {}
        for pod in pods:
            if pod.active and pod.node in node_gpus:
                by_node.setdefault(pod.node, []).append(pod)
        result: dict[tuple[str, int], Holder] = {}
        for node in list(self._held):
            if node not in by_node:
                del self._held[node]
        for node, node_pods in by_node.items():
            capacity = node_gpus[node]
            held = self._held.setdefault(node, {})
            live = {p.uid: p for p in node_pods}
            for uid in [u for u in held if u not in live]:
                del held[uid]
            for uid in list(held):  # capacity shrank (node replaced with fewer GPUs)
                if any(index >= capacity for index, _ in held[uid]):
                    del held[uid]
            for pod in node_pods:  # DRA pods hold what the scheduler allocated them
                if pod.dra:
                    held[pod.uid] = [(i, pod.containers[0][0]) for i in pod.devices if i < capacity]
            used = {index for slots in held.values() for index, _ in slots}
            for pod in sorted(node_pods, key=lambda p: (p.created, p.uid)):
                if pod.uid in held:
                    continue
                free = [i for i in range(capacity) if i not in used]
                if len(free) < pod.gpus:
                    continue  # over-committed (no scheduler in the way): leave it unattributed
                slots: list[tuple[int, str]] = []
                for container, count in pod.containers:
                    for _ in range(count):
                        index = free.pop(0)
                        used.add(index)
                        slots.append((index, container))
                held[pod.uid] = slots
            for uid, slots in held.items():
                for index, container in slots:
                    result[(node, index)] = Holder(live[uid], container)
        return result
