"""Idleness of pods (shared GPUs included) and the idle lifecycle kept in pod annotations.

The lifecycle lives only in the pod's annotations, never in memory, so a restarted operator or a
second replica continues the same clocks (safety rule 6):

* Idle, no ``idle-since`` -> set it to now, event GPUIdle (once).
* Idle for ``idleFor`` -> (Enforce only) set ``evict-after = now + warningPeriod``, Warning event
  GPUIdleEvictionScheduled (once).
* ``now >= evict-after`` and still idle -> an eviction candidate; budgets decide (budgets.py). Only
  once the idle evidence itself reaches the deadline (safety rule 12): the newest sample of every GPU
  of the pod at or after ``evict-after``. A store that hides its newest data (VictoriaMetrics'
  ``-search.latencyOffset``) answers with fresh but earlier samples, and the pod may have worked
  since them: until a sample past the deadline arrives the pod stays Idle and warned, and waits.
* Active again -> remove ``idle-since``, ``evict-after`` and ``eviction-blocked``; GPUActiveAgain if a
  warning was pending.
* Unknown -> nothing changes: the clock neither advances to a warning nor resets.

Observe mode sets ``idle-since`` and the state and emits GPUIdle, but never sets ``evict-after`` (a
warning of an eviction that cannot happen would be a lie) and never evicts; switching a policy from
Enforce to Observe removes pending warnings. The same holds for pods that can never be evicted
(DaemonSet, static, bare, high priority) and pods held by ``exempt=true`` or a valid acknowledgement
(``keep-until`` or ``keep-for``): they stay annotated Idle, without a warning. ``keep-until`` is
honoured until the earlier of its value and ``keep-until-seen + maxKeep``, ``keep-for`` until
``keep-until-seen`` plus the earlier of its duration and ``maxKeep``; ``keep-until-seen`` is set the
first time the engine sees either and removed with them, so a bound cannot be extended by editing
the timestamp. An unreadable ``keep-for`` is reported once (AcknowledgementInvalid) and ignored.
``release`` (a self-service click: the user gives the GPU back) makes an idle, unheld, enforced
pod a candidate at once, without waiting for ``evict-after``; activity removes it.

The annotations are the pod owner's to edit, so they are not trusted alone: a time in the future is
ignored (``evict-after`` later than one warning period is clamped to it), and the clock this
process wrote (``remembered``, idleledger.py) wins over a later or missing annotation, which is
then restored with a GPUIdleBookkeepingRestored event.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.timefmt import format_rfc3339, format_when, parse_rfc3339
from gpu_efficiency.engine.model import GPUSample, PodView, Verdict
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.acknowledge import ending_with, keep_command, parse_keep_for
from gpu_efficiency.engine.reclaim.activity import EvidenceReach, GPUActivity
from gpu_efficiency.engine.reclaim.budgets import EvictionCandidate
from gpu_efficiency.engine.reclaim.idleledger import IdleClock

PodKey = tuple[str, str]


class GPUState:
    """Raw state of one GPU from its own activity (before the sharing rule)."""

    IDLE = "idle"
    BUSY = "busy"
    UNKNOWN = "unknown"


def below_idle_threshold(peak: float, params: CycleParams) -> bool:
    """The idle rule: peak activity over the window stays under ``activityBelow``."""
    return peak < params.activity_below


def idle_rule(params: CycleParams) -> str:
    """The idle rule in words, appended to a pod's idle evidence after its peak."""
    return f" < activityBelow {params.activity_below} over the {format_duration(params.window_s)} window"


def gpu_state(activity: GPUActivity, params: CycleParams) -> str:
    """One GPU's raw state from its own activity: Unknown without a sound signal, else the idle rule."""
    if not activity.known:
        return GPUState.UNKNOWN
    return GPUState.IDLE if below_idle_threshold(activity.peak, params) else GPUState.BUSY


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
    awaiting_evidence: bool = False  # due, but the idle evidence does not reach evict-after yet
    clock: IdleClock | None = None  # the bookkeeping as the operator keeps it (idleledger.py)
    notes: list[str] = field(default_factory=list)  # bookkeeping values ignored or clamped, and why


#: Shared result for active pods without lifecycle state (most pods): callers must not mutate it.
NO_LIFECYCLE = Lifecycle()


def keep_for_problem(annotations: Mapping[str, str], params: CycleParams) -> str:
    """Why the pod's keep-for cannot be honoured ('' when it can, or there is none)."""
    text = annotations.get(names.KEEP_FOR)
    if text is None or not params.allow_keep_until:
        return ""
    try:
        parse_keep_for(text)
    except ValueError as exc:
        return f"{exc}; the acknowledgement is ignored and nothing else changes"
    return ""


def hold_reason(annotations: Mapping[str, str], params: CycleParams, now: float, seen: float | None) -> str:
    """Why an idle pod is held from warning/eviction by its own annotations ('' when not).

    ``keep-until`` and ``keep-for`` both count from ``seen`` (when the operator first saw them) and
    are bounded by ``maxKeep``; with both, the later of the two holds."""
    if params.allow_opt_out and annotations.get(names.EXEMPT, "").strip().lower() == "true":
        return f"opted out with {names.EXEMPT}=true"
    if not params.allow_keep_until or seen is None:
        return ""
    bound = seen + params.max_keep_s
    held: list[tuple[float, str]] = []
    until = parse_rfc3339(annotations.get(names.KEEP_UNTIL))
    if until is not None:
        held.append((min(until, bound), f"{names.KEEP_UNTIL}={annotations[names.KEEP_UNTIL]}"))
    text = annotations.get(names.KEEP_FOR)
    if text is not None and not keep_for_problem(annotations, params):  # a bad one is reported once
        held.append((min(seen + parse_keep_for(text), bound), f"{names.KEEP_FOR}={text}"))
    if not held:
        return ""
    honoured, what = max(held)
    if now >= honoured:
        return ""
    return f"acknowledged with {what}, honoured until {format_when(honoured, now)}"


class _Book:
    """Reads the operator's bookkeeping annotations against what it remembers writing: a time in
    the future is ignored, the earlier of annotation and memory wins, and an annotation that lost
    a remembered value (removed, or moved later) is rewritten and reported as tampered."""

    __slots__ = ("ann", "now", "out", "tampered")

    def __init__(self, ann: Mapping[str, str], now: float, out: Lifecycle) -> None:
        self.ann, self.now, self.out = ann, now, out
        self.tampered: list[str] = []

    def read(self, key: str, latest: float) -> float | None:
        """The annotation's time, None when absent, unparsable or after ``latest`` (noted)."""
        text = self.ann.get(key)
        value = parse_rfc3339(text)
        if value is not None and value > latest:
            self.out.notes.append(
                f"{key}={text} is later than {format_rfc3339(latest)}, which the operator never writes: ignored"
            )
            return None
        return value

    def settle(
        self, key: str, value: float | None, remembered: float | None, *, report: bool = True
    ) -> float | None:
        """The earlier of ``value`` (the annotation's, as read) and ``remembered``; the annotation
        is rewritten when it differs, and a lost remembered value is reported (with ``report``)."""
        known = [v for v in (value, remembered) if v is not None]
        if not known:
            return None
        best = float(min(known))
        text = format_rfc3339(best)
        current = self.ann.get(key)
        if current != text:
            self.out.updates[key] = text
            if report and remembered is not None and (value is None or value > remembered):
                self.tampered.append(f"{key} {'removed' if current is None else f'changed to {current!r}'}")
        return best


def _whole(ts: float) -> float:
    """A time as its annotation keeps it (whole seconds), so memory and annotation compare equal."""
    return float(math.floor(ts))


def idle_lifecycle(
    pod: PodView,
    verdict: Verdict,
    params: CycleParams,
    now: float,
    *,
    evidence: str,
    blocker: str,
    reach: EvidenceReach | None,
    remembered: IdleClock | None = None,
    subject: str = "the pod will be evicted",
) -> Lifecycle:
    """Advance, hold or reset the pod's idle clock (see the module docstring).

    ``evidence`` says why the pod is idle (for event texts); ``blocker`` is the permanent eviction
    filter that applies to the pod, if any (budgets.permanent_blocker, or its owner's: reclaim.py); ``remembered``: the clock
    this process wrote for the pod (idleledger.py), which edits of the annotations cannot undo.
    ``subject`` names what the warning announces ("deployment/nb will be scaled to zero");
    ``reach``: how far in time the idle evidence reaches (activity.evidence_reach; None: not known,
    so never far enough).
    """
    ann = pod.annotations
    if verdict is Verdict.UNKNOWN:
        return Lifecycle(
            warned=names.EVICT_AFTER in ann,
            hold="no usable data: the idle clock is kept as is",
            clock=remembered,
        )
    mem = remembered or IdleClock()
    has_keep = names.KEEP_UNTIL in ann or names.KEEP_FOR in ann
    if (
        verdict is not Verdict.IDLE
        and not has_keep
        and names.KEEP_SEEN not in ann
        and names.IDLE_SINCE not in ann
        and names.EVICT_AFTER not in ann
        and names.EVICTION_BLOCKED not in ann
        and names.RELEASE not in ann
    ):
        return NO_LIFECYCLE  # the common case: an active pod without any lifecycle state
    out = Lifecycle()
    book = _Book(ann, now, out)
    seen: float | None = None
    keep_seen: float | None = None
    if params.allow_keep_until:
        if has_keep:
            seen = book.settle(
                names.KEEP_SEEN, book.read(names.KEEP_SEEN, now), mem.keep_seen, report=mem.keep_shown
            )
            if seen is None:
                seen = _whole(now)
                out.updates[names.KEEP_SEEN] = format_rfc3339(now)
                problem = keep_for_problem(ann, params)
                if problem:  # told once: when the acknowledgement is first seen
                    out.events.append(PodEventSpec(names.EV_ACK_INVALID, problem, "Warning"))
            keep_seen = seen
        else:
            if names.KEEP_SEEN in ann:
                out.updates[names.KEEP_SEEN] = None
            if verdict is Verdict.IDLE:
                keep_seen = mem.keep_seen  # the same idle period: re-adding keep-until keeps its bound

    if verdict is not Verdict.IDLE:
        for key in (names.IDLE_SINCE, names.EVICT_AFTER, names.EVICTION_BLOCKED, names.RELEASE):
            if key in ann:
                out.updates[key] = None
        if names.EVICT_AFTER in ann and params.idle_enabled:
            out.events.append(
                PodEventSpec(
                    names.EV_ACTIVE_AGAIN,
                    f"this GPU is working again, so the scheduled eviction "
                    f"(evict-after {ann[names.EVICT_AFTER]}) is cancelled. Evidence: {evidence}",
                )
            )
        out.clock = IdleClock(keep_seen=keep_seen) if keep_seen is not None else None
        return out

    idle_since = book.settle(names.IDLE_SINCE, book.read(names.IDLE_SINCE, now), mem.idle_since)
    latest_warning = now + params.warning_period_s
    evict_after = book.read(names.EVICT_AFTER, latest_warning)
    if evict_after is None and parse_rfc3339(ann.get(names.EVICT_AFTER)) is not None:
        evict_after = _whole(latest_warning)  # pushed out: clamped to the latest we would write
    remembered_warning = mem.evict_after
    if idle_since is None:
        idle_since = _whole(now)
        evict_after = remembered_warning = None
        out.updates[names.IDLE_SINCE] = format_rfc3339(now)
        if names.EVICT_AFTER in ann:
            out.updates[names.EVICT_AFTER] = None
        out.events.append(
            PodEventSpec(
                names.EV_IDLE,
                f"this GPU has done no work for the last {format_duration(params.window_s)}. "
                f"Evidence: {evidence}",
            )
        )
    _lifecycle_of_idle(
        pod,
        params,
        out,
        now=now,
        evidence=evidence,
        blocker=blocker,
        book=book,
        idle_since=idle_since,
        evict_after=evict_after,
        remembered_warning=remembered_warning,
        seen=seen,
        subject=subject,
        reach=reach,
    )
    warned_at = out.updates.get(names.EVICT_AFTER, ann.get(names.EVICT_AFTER)) if out.warned else None
    out.clock = IdleClock(
        idle_since=idle_since, evict_after=parse_rfc3339(warned_at), keep_seen=keep_seen, keep_shown=has_keep
    )
    if book.tampered:
        out.events.append(
            PodEventSpec(
                names.EV_BOOKKEEPING_RESTORED,
                f"{'; '.join(book.tampered)} by someone other than the operator: restored from the "
                f"operator's record (GPU idle since {format_rfc3339(idle_since)})",
                "Warning",
            )
        )
    return out


def _when(ts: float) -> str:
    return format_rfc3339(ts) if math.isfinite(ts) else str(ts)


def evidence_short_of(reach: EvidenceReach | None, deadline: float) -> str:
    """Why the idle evidence does not reach ``deadline`` yet ('' when it does): safety rule 12.

    No new threshold: the wait lasts until the source's next sample past the deadline (one scrape
    on Prometheus; ``-search.latencyOffset`` more on VictoriaMetrics), and never ends on a time
    from the future, nor on none."""
    if reach is not None and reach.until >= deadline:  # False for NaN
        return ""
    head = f"evict-after {format_rfc3339(deadline)} passed; waiting for idle evidence that reaches it: "
    if reach is None or not reach.gpu:
        return head + "no GPU sample time"
    if reach.future:
        return head + (
            f"GPU {reach.gpu}'s newest sample time {_when(reach.newest)} is later than this cycle "
            "could have read (a clock ahead, or forged): not evidence"
        )
    if math.isnan(reach.until):
        return head + f"GPU {reach.gpu} has no sample time"
    return head + (
        f"GPU {reach.gpu}'s newest sample is from {_when(reach.until)}, "
        f"{format_duration(math.ceil(deadline - reach.until))} before it (the source hides or has not yet "
        "scraped newer data)"
    )


def _released(pod: PodView, now: float, evidence: str, out: Lifecycle, idle_since: float) -> None:
    """Its user gave the idle GPU back (``release``, written by a self-service click): a candidate
    now, without waiting for the deadline, through the same budgets and owner actions as any other.
    Only an idle pod is released (activity removes the annotation) and holds still win."""
    out.warned = names.EVICT_AFTER in pod.annotations
    out.candidate = EvictionCandidate(
        pod=pod,
        idle_since=idle_since,
        message=(
            f"its user gave this idle GPU back ({names.RELEASE}={pod.annotations[names.RELEASE]}): "
            f"reclaimed to free it. Idle since {format_when(idle_since, now)}; evidence: {evidence}"
        ),
    )


def _lifecycle_of_idle(
    pod: PodView,
    params: CycleParams,
    out: Lifecycle,
    *,
    now: float,
    evidence: str,
    blocker: str,
    book: _Book,
    idle_since: float,
    evict_after: float | None,
    remembered_warning: float | None,
    seen: float | None,
    subject: str,
    reach: EvidenceReach | None,
) -> None:
    """Hold, warn or make an eviction candidate of an idle pod (written into ``out``)."""
    ann = pod.annotations
    hold = hold_reason(ann, params, now, seen) or blocker
    if not hold and not params.enforce:
        hold = "Observe mode: annotate only, never warn or evict"
    if hold:
        out.hold = hold
        if names.EVICT_AFTER in ann:
            out.updates[names.EVICT_AFTER] = None  # a warning that cannot come true is withdrawn
        return
    if names.RELEASE in ann:
        _released(pod, now, evidence, out, idle_since)
        return

    evict_after = book.settle(names.EVICT_AFTER, evict_after, remembered_warning)
    if evict_after is None:
        idle_for = now - idle_since
        if idle_for < params.idle_for_s:
            out.hold = f"idle for {format_duration(idle_for)} < idleFor {format_duration(params.idle_for_s)}"
            return
        evict_after = now + params.warning_period_s
        text = format_rfc3339(evict_after)
        out.updates[names.EVICT_AFTER] = text
        message = (
            f"this GPU has done no work for {format_duration(now - idle_since + params.window_s)}: "
            f"{subject} after {format_when(evict_after, now)} unless its GPU becomes active"
            + (" or it is acknowledged" if params.allow_keep_until else "")
            + f". Idle since {format_when(idle_since, now)}, after a whole {format_duration(params.window_s)} "
            f"window without work; evidence: {evidence}"
        )
        if params.allow_keep_until:
            message = ending_with(
                message, f". To keep it: {keep_command(pod.namespace, pod.name, params.max_keep_s)}"
            )
        out.events.append(PodEventSpec(names.EV_EVICTION_SCHEDULED, message, "Warning"))
        out.warned = True
        return

    out.warned = True
    if now < evict_after:
        out.hold = f"warned: evict-after {format_rfc3339(evict_after)} not reached"
        return
    short = evidence_short_of(reach, evict_after)
    if short:
        out.hold, out.awaiting_evidence = short, True
        return
    out.candidate = EvictionCandidate(
        pod=pod,
        idle_since=idle_since,
        message=(
            f"this GPU did no work for {format_duration(now - idle_since + params.window_s)} and its "
            f"warning ran out: evicted to free the GPU. Idle since {format_when(idle_since, now)}, "
            f"evict-after {format_when(evict_after, now)}; evidence: {evidence}"
        ),
    )
