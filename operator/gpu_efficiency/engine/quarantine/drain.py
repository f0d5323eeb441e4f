"""The drain before a NoExecute fault taint: evict through the front door, then the hard stop.

A NoExecute taint (node) or DeviceTaintRule has Kubernetes delete the pods at once, without
looking at PodDisruptionBudgets. So where the policy asks for NoExecute, the operator takes the
steps of a drain (``node`` decides when, this module what): it first sets the NoSchedule form, so
nothing new lands; from the next cycle on (the soft form seen in place) it evicts the pods the
hard form would remove through the Eviction API, so PodDisruptionBudgets are honoured and a
refusal (HTTP 429) is only retried on later cycles; and it sets NoExecute once those pods are gone
or ``faults.drainTimeout`` has passed. The drain's start is kept in the node's fault record
(``drainSince``), so a restarted operator counts on from it.

Which pods: on a node taint, the GPU pods on the node; on device taints, the pods whose
ResourceClaims hold a faulty device (the claims' allocations, read while a rule of ours exists).
Pods that tolerate the NoExecute taint are none of the drain's business (the hard form leaves them
too). Pods the operator never evicts (protected namespaces, priority at or above the eviction
threshold, static and DaemonSet pods) and pods already terminating are waited for, not evicted:
the timeout bounds the wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api.names import FAULT_TAINT_KEY
from gpu_efficiency.engine.model import DeviceUse, DraDevice, PodView, Taint, Toleration

SOFT = "NoSchedule"
HARD = "NoExecute"
#: Phases of pods that hold nothing any more.
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class DrainContext:
    """What one node's drains may look at this cycle."""

    timeout_s: float
    pods: Sequence[PodView] = ()  # the GPU pods bound to the node
    #: Device -> the claim allocations holding it; None when the claims could not be read.
    uses: Mapping[tuple[str, str, str], Sequence[DeviceUse]] | None = None
    protected: frozenset[str] = frozenset()
    priority_threshold: int = 1_000_000_000


NO_DRAIN = DrainContext(timeout_s=0.0)


@dataclass(frozen=True, slots=True)
class DrainStep:
    """One cycle of a drain: the pods to evict, those only waited for, and whether to set NoExecute."""

    evict: tuple[PodView, ...]
    waiting: tuple[PodView, ...]  # still there, never evicted by the operator (or terminating)
    upgrade: bool
    why: str  # one sentence: where the drain stands


def _tolerated(tolerations: Sequence[Toleration], kind: str) -> bool:
    taint = Taint(FAULT_TAINT_KEY, kind, HARD)
    return any(t.tolerates(taint) for t in tolerations)


def drain_targets(
    kind: str, devices: Sequence[DraDevice] | None, ctx: DrainContext
) -> tuple[PodView, ...] | None:
    """The pods the hard form would remove (None: unknown, the claims could not be read)."""
    live = [p for p in ctx.pods if p.phase not in _DONE_PHASES]
    if devices is None:
        return tuple(p for p in live if not _tolerated(p.fault_tolerations, kind))
    if ctx.uses is None:
        return None
    uids = {
        uid
        for device in devices
        for use in ctx.uses.get(device.key, ())
        if not _tolerated(use.tolerations, kind)
        for uid in use.pods
    }
    return tuple(p for p in live if p.uid in uids)


def evictable(pod: PodView, ctx: DrainContext) -> bool:
    """The operator may evict it (the same protections as for idle pods; bare pods included: the
    hard form would remove them anyway)."""
    return not (
        pod.deleting
        or pod.is_static
        or pod.controller_kind == "DaemonSet"
        or pod.namespace in ctx.protected
        or pod.priority >= ctx.priority_threshold
    )


def drain_step(
    kind: str, devices: Sequence[DraDevice] | None, since: float, now: float, ctx: DrainContext
) -> DrainStep:
    """This cycle's step of the drain that began at ``since``."""
    targets = drain_targets(kind, devices, ctx)
    deadline = since + ctx.timeout_s
    if targets is None:
        if now >= deadline:
            return DrainStep((), (), True, "the drain timeout passed (who holds the device is unknown)")
        return DrainStep(
            (), (), False, "who holds the device is unknown (claims unread): waiting for the timeout"
        )
    if not targets:
        return DrainStep((), (), True, "every pod is gone")
    if now >= deadline:
        left = ", ".join(f"{p.namespace}/{p.name}" for p in targets[:5]) + (
            " ..." if len(targets) > 5 else ""
        )
        return DrainStep(
            (), targets, True, f"the drain timeout passed with {len(targets)} pod(s) left: {left}"
        )
    evict = tuple(p for p in targets if evictable(p, ctx))
    waiting = tuple(p for p in targets if not evictable(p, ctx))
    why = f"draining: {len(evict)} pod(s) to evict, {len(waiting)} waited for, NoExecute in {deadline - now:.0f}s at the latest"
    return DrainStep(evict, waiting, False, why)
