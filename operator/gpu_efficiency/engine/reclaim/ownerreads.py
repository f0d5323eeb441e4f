"""When a cycle must read the pods' owners from the API server, and when the last read will do.

Owners are listed cluster-wide (seven LISTs), so reading them every cycle would end the operator's
"a steady cluster costs no API reads". They matter at two moments only: when an in-scope pod is
about to be warned (the warning names what will be done to which owner, and a partly idle owner's
pod gets its recommendation instead) and when a warned pod is due (the action itself,
which must see today's replicas, HPAs and PodDisruptionBudgets). In between, the last read only
shapes annotation texts, which a read a few minutes old shapes the same way. A pod that can never
be warned (Observe mode, a pod no eviction may touch, one opted out) has neither moment: idle past
``idleFor``, it was read afresh every cycle for a warning that never came (7 LISTs a cycle, 15 once
a minute with the CRD kinds' discovery: the 300-node benchmark's 7-15), so the last read serves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine.model import PodVerdict, PodView, Verdict
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.budgets import permanent_blocker
from gpu_efficiency.engine.reclaim.idle import hold_reason
from gpu_efficiency.engine.selection import Scope


class OwnerRead(Enum):
    NONE = "none"  # no pod in scope has an idle clock: nothing about owners can matter
    CACHED = "cached"  # clocks run, nobody is being warned or due: the last read will do
    FRESH = "fresh"  # a pod is warned or acted on this cycle: read the owners now


def never_warned(pod: PodView, params: CycleParams, now: float) -> bool:
    """Whether no warning or reclaim can come to this pod whatever its clocks say: the holds of
    ``idle.py`` that last (Observe mode, a permanent blocker, ``exempt=true`` where allowed; an
    acknowledgement ends, so it is not one of them: ``hold_reason`` without its first-seen time)."""
    if not params.enforce or permanent_blocker(pod, params):
        return True
    return bool(hold_reason(pod.annotations, params, now, None))


def owner_read_needed(pods: Iterable[PodView], scope: Scope, now: float, params: CycleParams) -> OwnerRead:
    """What this cycle needs of the owners, from the in-scope pods' idle bookkeeping."""
    need = OwnerRead.NONE
    for pod in pods:
        since = parse_rfc3339(pod.annotations.get(names.IDLE_SINCE))
        if since is None or scope.exclusion(pod):
            continue
        if never_warned(pod, params, now):
            need = OwnerRead.CACHED
            continue
        deadline = parse_rfc3339(pod.annotations.get(names.EVICT_AFTER))
        if deadline is None and since + params.idle_for_s <= now:
            return OwnerRead.FRESH  # warned this cycle
        if deadline is not None and deadline <= now:
            return OwnerRead.FRESH  # due this cycle
        if names.RELEASE in pod.annotations:
            return OwnerRead.FRESH  # given back by its user: due this cycle
        need = OwnerRead.CACHED
    return need


def starts_idle_clock(pods: Iterable[PodView], verdicts: Iterable[PodVerdict]) -> bool:
    """Whether a pod judged Idle this cycle has no idle clock yet: its first idle annotation carries
    its owner's recommendation, so the owners are needed before any clock runs."""
    idle = {(v.namespace, v.name) for v in verdicts if v.verdict is Verdict.IDLE}
    return bool(idle) and any(
        (pod.namespace, pod.name) in idle and names.IDLE_SINCE not in pod.annotations for pod in pods
    )
