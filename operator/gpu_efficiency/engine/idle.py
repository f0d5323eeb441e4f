"""Idleness of pods (shared GPUs included) and the idle lifecycle kept in pod annotations.

The lifecycle lives only in the pod's annotations, never in memory, so a restarted operator or a
second replica continues the same clocks (safety rule 6):

* Idle, no ``idle-since`` -> set it to now, event GPUIdle (once).
* Idle for ``idleFor`` -> (Enforce only) set ``evict-after = now + warningPeriod``, Warning event
  GPUIdleEvictionScheduled (once).
* ``now >= evict-after`` and still idle -> an eviction candidate; budgets decide (budgets.py).
* Active again -> remove ``idle-since``, ``evict-after`` and ``eviction-blocked``; GPUActiveAgain if a
  warning was pending.
* Unknown -> nothing changes: the clock neither advances to a warning nor resets.

Observe mode sets ``idle-since`` and the state and emits GPUIdle, but never sets ``evict-after`` (a
warning of an eviction that cannot happen would be a lie) and never evicts; switching a policy from
Enforce to Observe removes pending warnings. The same holds for pods that can never be evicted
(DaemonSet, static, bare, high priority) and pods held by ``exempt=true`` or a valid ``keep-until``:
they stay annotated Idle, without a warning. ``keep-until`` is honoured until the earlier of its value
and ``keep-until-seen + maxKeep``; ``keep-until-seen`` is set the first time the engine sees a
``keep-until`` and removed with it, so a bound cannot be extended by editing the timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.engine.budgets import EvictionCandidate
from gpu_efficiency.engine.model import GPUSample, PodView, Verdict
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.timefmt import format_rfc3339, parse_rfc3339

PodKey = tuple[str, str]


class GPUState:
    """Raw state of one GPU from its own activity (before the sharing rule)."""

    IDLE = "idle"
    BUSY = "busy"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class SharedIdleness:
    """Outcome of the sharing rule for a pod whose own GPUs are all idle."""

    state: str  # GPUState.IDLE, BUSY or UNKNOWN
    why: str  # '' for IDLE, else which co-tenant or GPU prevents idleness


def shared_idleness(
    start: PodKey,
    pod_gpus: Mapping[PodKey, Sequence[GPUSample]],
    gpu_state: Callable[[GPUSample], str],
) -> SharedIdleness:
    """Idle only if every pod reachable through shared GPUs has only idle GPUs.

    A GPU counts idle for a pod only if all pods on it are idle, and a pod is idle only if all its
    GPUs are, so the rule closes over the connected component of pods linked by shared GPUs.
    Busy anywhere wins over Unknown anywhere (a busy co-tenant settles "not idle" with data).
    """
    seen_pods = {start}
    seen_gpus: set[str] = set()
    queue = [start]
    unknown = ""
    while queue:
        key = queue.pop()
        for sample in pod_gpus.get(key, ()):
            if sample.uuid in seen_gpus:
                continue
            seen_gpus.add(sample.uuid)
            state = gpu_state(sample)
            if state == GPUState.BUSY:
                return SharedIdleness(
                    GPUState.BUSY, f"GPU {sample.uuid} of co-tenant {key[0]}/{key[1]} is busy"
                )
            if state == GPUState.UNKNOWN and not unknown:
                unknown = f"GPU {sample.uuid} of co-tenant {key[0]}/{key[1]} has no usable data"
            for ref in sample.pods:
                other = (ref.namespace, ref.name)
                if other not in seen_pods:
                    seen_pods.add(other)
                    queue.append(other)
    if unknown:
        return SharedIdleness(GPUState.UNKNOWN, unknown)
    return SharedIdleness(GPUState.IDLE, "")


def is_shared(samples: Sequence[GPUSample], key: PodKey) -> bool:
    """True when another pod appears on any of these GPUs (the sharing rule then applies)."""
    for sample in samples:
        for ref in sample.pods:
            if ref.name != key[1] or ref.namespace != key[0]:
                return True
    return False


@dataclass(slots=True)
class PodEventSpec:
    reason: str
    message: str
    type: str = "Normal"


@dataclass(slots=True)
class Lifecycle:
    """What the idle lifecycle decided for one pod this cycle."""

    updates: dict[str, str | None] = field(default_factory=dict)  # lifecycle annotation changes
    events: list[PodEventSpec] = field(default_factory=list)
    candidate: EvictionCandidate | None = None
    warned: bool = False  # carries evict-after after this cycle
    hold: str = ""  # why no warning/eviction progresses (explain and notes)


#: Shared result for active pods without lifecycle state (most pods): callers must not mutate it.
_NOTHING = Lifecycle()


def hold_reason(annotations: Mapping[str, str], params: CycleParams, now: float, seen: float | None) -> str:
    """Why an idle pod is held from warning/eviction by its own annotations ('' when not)."""
    if params.allow_opt_out and annotations.get(names.EXEMPT, "").strip().lower() == "true":
        return f"opted out with {names.EXEMPT}=true"
    if params.allow_keep_until:
        text = annotations.get(names.KEEP_UNTIL)
        until = parse_rfc3339(text)
        if until is not None and seen is not None:
            honoured = min(until, seen + params.max_keep_s)
            if now < honoured:
                return (
                    f"acknowledged with {names.KEEP_UNTIL}={text}, honoured until {format_rfc3339(honoured)}"
                )
    return ""


def idle_lifecycle(
    pod: PodView,
    verdict: Verdict,
    params: CycleParams,
    now: float,
    *,
    evidence: str,
    blocker: str,
    subject: str = "the pod will be evicted",
) -> Lifecycle:
    """Advance, hold or reset the pod's idle clock (see the module docstring).

    ``evidence`` says why the pod is idle (for event texts); ``blocker`` is the permanent eviction
    filter that applies to the pod, if any (budgets.permanent_blocker, or its owner's: reclaim.py);
    ``subject`` names what the warning announces ("deployment/nb will be scaled to zero").
    """
    ann = pod.annotations
    if verdict is Verdict.UNKNOWN:
        return Lifecycle(warned=names.EVICT_AFTER in ann, hold="no usable data: the idle clock is kept as is")
    has_keep = names.KEEP_UNTIL in ann
    if (
        verdict is not Verdict.IDLE
        and not has_keep
        and names.KEEP_SEEN not in ann
        and names.IDLE_SINCE not in ann
        and names.EVICT_AFTER not in ann
        and names.EVICTION_BLOCKED not in ann
    ):
        return _NOTHING  # the common case: an active pod without any lifecycle state
    out = Lifecycle()
    seen: float | None = None
    if params.allow_keep_until:
        if has_keep and names.KEEP_SEEN not in ann:
            out.updates[names.KEEP_SEEN] = format_rfc3339(now)
            seen = now
        elif has_keep:
            seen = parse_rfc3339(ann[names.KEEP_SEEN])  # unparsable: keep-until not honoured
        elif names.KEEP_SEEN in ann:
            out.updates[names.KEEP_SEEN] = None

    if verdict is not Verdict.IDLE:
        for key in (names.IDLE_SINCE, names.EVICT_AFTER, names.EVICTION_BLOCKED):
            if key in ann:
                out.updates[key] = None
        if names.EVICT_AFTER in ann and params.idle_enabled:
            out.events.append(
                PodEventSpec(
                    names.EV_ACTIVE_AGAIN,
                    f"GPU active again ({evidence}): the scheduled eviction "
                    f"(evict-after {ann[names.EVICT_AFTER]}) is cancelled",
                )
            )
        return out

    idle_since = parse_rfc3339(ann.get(names.IDLE_SINCE))
    evict_after = parse_rfc3339(ann.get(names.EVICT_AFTER))
    if idle_since is None or idle_since > now:
        idle_since = now
        evict_after = None
        out.updates[names.IDLE_SINCE] = format_rfc3339(now)
        if names.EVICT_AFTER in ann:
            out.updates[names.EVICT_AFTER] = None
        out.events.append(PodEventSpec(names.EV_IDLE, f"GPU idle: {evidence}"))

    hold = hold_reason(ann, params, now, seen) or blocker
    if not hold and not params.enforce:
        hold = "Observe mode: annotate only, never warn or evict"
    if hold:
        out.hold = hold
        if names.EVICT_AFTER in ann:
            out.updates[names.EVICT_AFTER] = None  # a warning that cannot come true is withdrawn
        return out

    if evict_after is None:
        idle_for = now - idle_since
        if idle_for < params.idle_for_s:
            out.hold = f"idle for {format_duration(idle_for)} < idleFor {format_duration(params.idle_for_s)}"
            return out
        evict_after = now + params.warning_period_s
        text = format_rfc3339(evict_after)
        out.updates[names.EVICT_AFTER] = text
        out.events.append(
            PodEventSpec(
                names.EV_EVICTION_SCHEDULED,
                f"GPU idle since {format_rfc3339(idle_since)} ({evidence}): {subject} "
                f"after {text} unless its GPU becomes active"
                + (f" or it is acknowledged with {names.KEEP_UNTIL}" if params.allow_keep_until else ""),
                "Warning",
            )
        )
        out.warned = True
        return out

    out.warned = True
    if now < evict_after:
        out.hold = f"warned: evict-after {format_rfc3339(evict_after)} not reached"
        return out
    out.candidate = EvictionCandidate(
        pod=pod,
        idle_since=idle_since,
        message=(
            f"GPU idle since {format_rfc3339(idle_since)} ({evidence}); warned with evict-after "
            f"{format_rfc3339(evict_after)}; evicted to free the GPU"
        ),
    )
    return out
