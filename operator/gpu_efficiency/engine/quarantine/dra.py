"""Single-GPU quarantine: on a DRA node, a fault a GPU reset repairs taints the device, not the node.

A node's GPUs are DRA devices when a ResourceSlice lists them (a ``uuid`` attribute naming the GPU
the metrics see). For such a node, a held fault whose every GPU needs only a reset (an XID of the
reset-gpu class in the XID catalogue) is quarantined by one DeviceTaintRule per faulty device,
selecting exactly that device (driver, pool, device): the scheduler keeps new claims off it, and
with NoExecute the kube-controller-manager evicts only the pods using it; the node's healthy GPUs
stay schedulable. Any other fault (a reboot- or support-class XID, ECC, heat), or a GPU no slice
lists, keeps the node taint. Our rules count as our taint for the node's fault state machine
(``node``): the same recovery, manual-untaint and circuit-breaker rules apply.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_efficiency.api.policy import DeviceQuarantine, XidResolution
from gpu_efficiency.engine.model import DeviceRule, DraDevice, NodeView
from gpu_efficiency.engine.quarantine.kinds import FaultKind
from gpu_efficiency.engine.quarantine.record import FaultEntry
from gpu_efficiency.engine.quarantine.xid_catalogue import resolution

#: XID classes a GPU reset repairs: the node's other GPUs are not at fault.
SINGLE_GPU_CLASSES = frozenset({XidResolution.RESET_GPU})

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def single_gpu(kind: str, entry: FaultEntry) -> bool:
    """The fault needs only a reset of its GPUs: an XID of a single-GPU class on every GPU held."""
    if kind != FaultKind.XID.value or not entry.gpus:
        return False
    codes = [g.fingerprint.get("xid") for g in entry.gpus]
    return all(c is not None and resolution(int(c)) in SINGLE_GPU_CLASSES for c in codes)


@dataclass(frozen=True, slots=True)
class DeviceScope:
    """One node's DRA GPUs and our DeviceTaintRules on it, for its fault decision."""

    enabled: bool
    effect: str  # the policy's device taint effect
    devices: Mapping[str, DraDevice] = field(default_factory=dict)  # GPU UUID -> device
    rules: Mapping[str, Mapping[DeviceKey, str]] = field(default_factory=dict)  # kind -> device -> effect

    def devices_for(self, kind: str, entry: FaultEntry) -> tuple[DraDevice, ...] | None:
        """The devices to taint for a held fault, or None when the node taint is the way."""
        if not self.enabled or not single_gpu(kind, entry):
            return None
        found = [self.devices.get(g.uuid) for g in entry.gpus]
        if any(d is None for d in found):
            return None
        return tuple(sorted((d for d in found if d is not None), key=lambda d: d.key))

    def wanted(self, devices: Sequence[DraDevice]) -> dict[DeviceKey, str]:
        return {d.key: self.effect for d in devices}


NO_SCOPE = DeviceScope(enabled=False, effect="NoSchedule")


def device_scopes(
    nodes: Iterable[NodeView],
    devices: Iterable[DraDevice],
    rules: Iterable[DeviceRule],
    spec: DeviceQuarantine,
) -> dict[str, DeviceScope]:
    """Each node's scope: its DRA GPUs (the policy allowing) and the rules we hold on it.

    Our rules are always reported, even with single-GPU quarantine turned off, so they are removed
    on recovery and replaced by the node taint while the fault is held.
    """
    by_node: dict[str, dict[str, DraDevice]] = defaultdict(dict)
    for device in devices:
        by_node[device.node][device.uuid] = device
    held: dict[str, dict[str, dict[DeviceKey, str]]] = defaultdict(lambda: defaultdict(dict))
    for rule in rules:
        held[rule.node][rule.kind][rule.key] = rule.effect
    out: dict[str, DeviceScope] = {}
    for node in nodes:
        gpus = by_node.get(node.name, {})
        ours = held.get(node.name, {})
        if gpus or ours:
            out[node.name] = DeviceScope(
                enabled=spec.enabled,
                effect=spec.effect.value,
                devices=dict(gpus) if spec.enabled else {},
                rules={kind: dict(r) for kind, r in ours.items()},
            )
    return out


def with_dra_capacity(nodes: Iterable[NodeView], devices: Iterable[DraDevice]) -> tuple[NodeView, ...]:
    """Nodes whose GPUs are DRA devices only (no ``nvidia.com/gpu`` capacity) counted as GPU nodes.

    A DRA driver publishes no extended resource, yet such a node is a GPU node for every rule
    (scope, the breaker's share, trusting samples against its GPU count): its capacity is the
    number of GPUs its slices list.
    """
    counts: dict[str, set[str]] = defaultdict(set)
    for device in devices:
        counts[device.node].add(device.uuid)
    return tuple(
        replace(n, gpu_capacity=len(counts[n.name])) if n.gpu_capacity == 0 and counts.get(n.name) else n
        for n in nodes
    )


def describe_devices(devices: Sequence[DraDevice]) -> str:
    """'gpu.nvidia.com/node-1/gpu-3, ...'."""
    return ", ".join(d.label for d in devices)
