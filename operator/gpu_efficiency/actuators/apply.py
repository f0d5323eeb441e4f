"""Apply a plan: one shared applier owns dry-run, ordering, follow-up events and outcome reporting.

Evictions are followed by the event their outcome calls for (``GPUIdleEvicted`` or, on the first
refusal only, ``EvictionBlocked`` plus the ``eviction-blocked`` annotation so it is not repeated).
Those follow-up events are best effort: an eviction the API accepted is done, and counted against
the budgets, whatever happens to its event.

Every write first asks ``still_leader``: a term can end mid-cycle, and what is left of the plan is
then the new leader's to make.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import metrics
from gpu_efficiency.actuators import dra, nodes, owners
from gpu_efficiency.actuators.events import EventRecorder, ObjectRef, node_ref, pod_ref, policy_ref
from gpu_efficiency.actuators.pods import annotate_pod, evict_pod
from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    AnnotateNode,
    AnnotatePod,
    DrainPod,
    EvictPod,
    NodeEvent,
    OwnerEvent,
    PodEvent,
    PolicyEvent,
    ReclaimOwner,
    SetNodeCondition,
    TaintDevices,
    TaintNode,
    UntaintDevices,
    UntaintNode,
)
from gpu_efficiency.engine.outcomes import Outcome, Result

log = logging.getLogger(__name__)


#: The follow-up events are exported at 0 from the start, so an alert's rate() sees the first failure.
for _reason in (names.EV_EVICTED, names.EV_EVICTION_BLOCKED, names.EV_DRAINED):
    metrics.EVENTS_FAILED.labels(_reason)


@dataclass
class Applier:
    api_client: client.ApiClient
    recorder: EventRecorder
    dry_run: bool = False
    writes: int = 0
    #: Called with each outcome as it happens, ``obj`` (what the write returned) still attached: the
    #: watch cache reads its own writes. The outcomes returned drop ``obj`` (a first cycle patches
    #: thousands of pods: their JSON is not kept until the plan is done).
    on_written: Callable[[Outcome], None] | None = None
    #: Asked right before every write (the leader election's guard; always true without one).
    still_leader: Callable[[], bool] = lambda: True

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    def apply(
        self,
        actions: Iterable[Action],
        *,
        policy_name: str,
        policy_uid: str,
    ) -> list[Outcome]:
        policy = policy_ref(policy_name, policy_uid)
        outcomes = []
        taint_failed: set[str] = set()
        for action in actions:
            if self.dry_run:
                outcomes.append(Outcome(action, Result.SKIPPED, "dry run"))
                continue
            if not self.still_leader():
                outcomes.append(Outcome(action, Result.SKIPPED, "not the leader any more"))
                continue
            if (
                isinstance(action, AnnotateNode)
                and action.node in taint_failed
                and names.NODE_FAULTS in action.annotations
            ):
                # The record says the taint is set: written without it, the next cycle would take the
                # missing taint for an admin's removal. Kept as it was, the taint is retried.
                outcomes.append(
                    Outcome(action, Result.SKIPPED, "the taint failed: fault record kept, retried next cycle")
                )
                continue
            try:
                outcome = self._apply_one(action, policy)
            except ApiException as exc:
                outcome = Outcome(action, Result.FAILED, f"HTTP {exc.status}: {exc.reason}")
            except Exception as exc:  # one failed write must not stop the rest of the plan
                log.exception("applying %s failed", type(action).__name__)
                outcome = Outcome(action, Result.FAILED, str(exc))
            if outcome.result is Result.DONE:
                self.writes += 1
            if outcome.result is Result.UNKNOWN:
                log.warning("%s: outcome unknown, counted as done: %s", action, outcome.message)
            if outcome.result is Result.FAILED:
                log.warning("%s failed: %s", action, outcome.message)
                if isinstance(action, (TaintNode, TaintDevices)):
                    taint_failed.add(action.node)
            if self.on_written is not None:
                self.on_written(outcome)
            outcomes.append(replace(outcome, obj=None) if outcome.obj is not None else outcome)
        return outcomes

    def _follow_up_event(self, ref: ObjectRef, reason: str, message: str, type_: str) -> None:
        """An event that follows another action's outcome (it has no outcome of its own to count).

        Best effort: a failure is logged and counted, and never changes the outcome it follows."""
        try:
            self.recorder.record(ref, reason, message, type_)
        except Exception as exc:
            log.warning("event %s on %s %s failed: %s", reason, ref.kind, ref.name, exc)
            metrics.EVENTS_FAILED.labels(reason).inc()
            return
        self.writes += 1

    def _apply_one(self, action: Action, policy: ObjectRef) -> Outcome:
        handler = _HANDLERS[type(action)]
        return handler(self, action, policy)

    # -- one method per action type ------------------------------------------------------------

    def _annotate_pod(self, action: AnnotatePod, policy: ObjectRef) -> Outcome:
        return annotate_pod(self.core, action)

    def _evict(self, action: EvictPod, policy: ObjectRef) -> Outcome:
        outcome = evict_pod(self.core, action)
        pod = pod_ref(action.namespace, action.name, action.uid)
        if outcome.result is Result.DONE:
            self._follow_up_event(pod, names.EV_EVICTED, action.reason, "Warning")
            self._follow_up_event(
                policy,
                names.EV_EVICTED,
                f"evicted {action.namespace}/{action.name}: {action.reason}",
                "Normal",
            )
        elif outcome.result is Result.BLOCKED:
            first = annotate_pod(
                self.core,
                AnnotatePod(
                    namespace=action.namespace,
                    name=action.name,
                    uid=action.uid,
                    annotations={names.EVICTION_BLOCKED: format_rfc3339(time.time())},
                ),
            )
            message = f"eviction refused, will retry next cycle: {outcome.message}"
            if first.result is Result.DONE:
                self.writes += 1
                self._follow_up_event(pod, names.EV_EVICTION_BLOCKED, message, "Warning")
                return replace(outcome, obj=first.obj)  # the annotated pod, for read-your-writes
        return outcome

    def _drain(self, action: DrainPod, policy: ObjectRef) -> Outcome:
        """The idle evictor's front door for a fault drain; its events name the fault, a refusal is
        retried by the next cycle's plan (the drain timeout bounds it)."""
        evict = EvictPod(namespace=action.namespace, name=action.name, uid=action.uid, reason=action.reason)
        outcome = replace(evict_pod(self.core, evict), action=action)
        pod = pod_ref(action.namespace, action.name, action.uid)
        if outcome.result is Result.DONE:
            self._follow_up_event(pod, names.EV_DRAINED, action.reason, "Warning")
            self._follow_up_event(
                node_ref(action.node),
                names.EV_DRAINED,
                f"evicted {action.namespace}/{action.name}: {action.reason}",
                "Normal",
            )
        elif outcome.result is Result.BLOCKED:
            message = f"eviction off a faulty GPU refused, retried next cycle until the drain timeout: {outcome.message}"
            self._follow_up_event(pod, names.EV_EVICTION_BLOCKED, message, "Warning")
        return outcome

    def _reclaim(self, action: ReclaimOwner, policy: ObjectRef) -> Outcome:
        outcome = owners.reclaim_owner(self.custom, action, time.time())
        if outcome.result is Result.DONE:
            for ref, message in owners.reclaim_events(action):
                self._follow_up_event(ref, names.EV_RECLAIMED, message, "Warning")
            who = f"{action.owner.kind.lower()}/{action.owner.name} in {action.namespace}"
            self._follow_up_event(
                policy, names.EV_RECLAIMED, f"{action.action} {who}: {action.reason}", "Normal"
            )
        return outcome

    def _pod_event(self, action: PodEvent, policy: ObjectRef) -> Outcome:
        self.recorder.record(
            pod_ref(action.namespace, action.name, action.uid), action.reason, action.message, action.type
        )
        return Outcome(action, Result.DONE)

    def _owner_event(self, action: OwnerEvent, policy: ObjectRef) -> Outcome:
        owner = action.owner
        ref = ObjectRef(owner.kind, owner.name, owner.uid, action.namespace, owner.api_version)
        self.recorder.record(ref, action.reason, action.message, action.type)
        return Outcome(action, Result.DONE)

    def _node_event(self, action: NodeEvent, policy: ObjectRef) -> Outcome:
        self.recorder.record(node_ref(action.node), action.reason, action.message, action.type)
        return Outcome(action, Result.DONE)

    def _policy_event(self, action: PolicyEvent, policy: ObjectRef) -> Outcome:
        self.recorder.record(policy, action.reason, action.message, action.type)
        return Outcome(action, Result.DONE)

    def _taint(self, action: TaintNode, policy: ObjectRef) -> Outcome:
        return nodes.apply_taint(self.core, action)

    def _untaint(self, action: UntaintNode, policy: ObjectRef) -> Outcome:
        return nodes.remove_taint(self.core, action)

    def _taint_devices(self, action: TaintDevices, policy: ObjectRef) -> Outcome:
        return dra.taint_devices(self.custom, action)

    def _untaint_devices(self, action: UntaintDevices, policy: ObjectRef) -> Outcome:
        return dra.untaint_devices(self.custom, action)

    def _condition(self, action: SetNodeCondition, policy: ObjectRef) -> Outcome:
        return nodes.set_gpu_healthy_condition(self.core, action, time.time())

    def _annotate_node(self, action: AnnotateNode, policy: ObjectRef) -> Outcome:
        return nodes.annotate_node(self.core, action)


_HANDLERS: dict[type, Callable[[Applier, object, ObjectRef], Outcome]] = {
    AnnotatePod: Applier._annotate_pod,  # type: ignore[dict-item]
    EvictPod: Applier._evict,  # type: ignore[dict-item]
    DrainPod: Applier._drain,  # type: ignore[dict-item]
    ReclaimOwner: Applier._reclaim,  # type: ignore[dict-item]
    PodEvent: Applier._pod_event,  # type: ignore[dict-item]
    OwnerEvent: Applier._owner_event,  # type: ignore[dict-item]
    NodeEvent: Applier._node_event,  # type: ignore[dict-item]
    PolicyEvent: Applier._policy_event,  # type: ignore[dict-item]
    TaintNode: Applier._taint,  # type: ignore[dict-item]
    UntaintNode: Applier._untaint,  # type: ignore[dict-item]
    TaintDevices: Applier._taint_devices,  # type: ignore[dict-item]
    UntaintDevices: Applier._untaint_devices,  # type: ignore[dict-item]
    SetNodeCondition: Applier._condition,  # type: ignore[dict-item]
    AnnotateNode: Applier._annotate_node,  # type: ignore[dict-item]
}
