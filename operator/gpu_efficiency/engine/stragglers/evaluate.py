"""Stragglers: the one slow GPU that holds back a whole synchronous job.

A data-parallel job waits for its slowest GPU at every all-reduce. Each GPU of a job group
(``jobgroups.py``) is compared with its group's median on SM activity, tensor activity, SM clock
and power, each averaged over the activity window. The spread is the median absolute deviation
scaled by 1.4826 (the standard deviation of normal noise): unlike the mean and standard deviation,
neither moves much for one outlier, so a slow GPU cannot hide itself by widening the spread. A GPU
is a straggler on a signal when it is more than ``madFactor`` spreads AND more than
``minShortfall`` of the median below it: the first alone flags noise in a group of identical GPUs
(a spread near zero), the second alone flags the normal scatter of a noisy signal.

Only a busy group is judged (median activity at least ``busyAbove``: an idle or warming-up job has
nothing to wait for), only with at least ``minGpus`` GPUs of usable data, and a GPU is reported only
after it stayed slow ``forDuration``: the time it was first seen slow is kept on its pod
(``straggler-since``), so a restart neither forgets nor repeats it. The report is an annotation on
every pod of the group, written when the set of stragglers or their causes change or a slowdown
moves by 10 points; events go out with those changes only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.policy import StragglerRule
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    GPUSample,
    NodeEvent,
    OwnerEvent,
    PodEvent,
    PodView,
    Signal,
    Snapshot,
    Stats,
    StragglerGroupView,
    Window,
)
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState
from gpu_efficiency.engine.quarantine.pcie import downtrained
from gpu_efficiency.engine.quarantine.thermal import HW_SLOWDOWN, HW_THERMAL, SW_THERMAL
from gpu_efficiency.engine.reclaim.activity import DataBounds, GPUActivity, gpu_activity, usable
from gpu_efficiency.engine.reclaim.idle import PodKey
from gpu_efficiency.engine.stragglers.jobgroups import JobGroup, job_groups

#: MAD x 1.4826 estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
#: Activity ratios below this median are not compared: a pipe used 5 % of the time is not what the
#: job waits on, and shortfalls of a near-zero median are noise.
MIN_RATIO_MEDIAN = 0.05
#: A rewritten slowdown must have moved by this many points (the pod annotations' 0.1 tolerance).
PERCENT_TOLERANCE = 10
SW_POWER_CAP = 0x4
HW_POWER_BRAKE = 0x80
_FRACTION = 1.0 + 1e-6
_UNBOUNDED = math.inf

#: The signals compared, with their largest valid value and how a message names them.
COMPARED: tuple[tuple[Signal, float, str], ...] = (
    (Signal.SM_ACTIVE, _FRACTION, "SM activity"),
    (Signal.TENSOR_ACTIVE, _FRACTION, "tensor activity"),
    (Signal.SM_CLOCK, _UNBOUNDED, "SM clock"),
    (Signal.POWER, _UNBOUNDED, "power"),
)
_RATIOS = frozenset({Signal.SM_ACTIVE, Signal.TENSOR_ACTIVE})
#: The annotation's entries are separated by this (never inside one: causes hold no '|').
SEPARATOR = " | "
_SLOWER = re.compile(r" is (\d+)% slower than its group \([^)]*\)")

NO_HARDWARE = "no hardware cause (uneven work: data skew or a slow input rank)"


@dataclass(frozen=True, slots=True)
class StragglerParams:
    enabled: bool
    group_by: tuple[str, ...]
    min_gpus: int
    mad_factor: float
    min_shortfall: float
    busy_above: float
    for_s: float
    temperature_limit: float
    min_pod_age_s: float


def straggler_params(rule: StragglerRule, temperature_limit: float, min_pod_age_s: float) -> StragglerParams:
    return StragglerParams(
        enabled=rule.enabled,
        group_by=tuple(rule.group_by),
        min_gpus=rule.min_gpus,
        mad_factor=rule.mad_factor,
        min_shortfall=rule.min_shortfall,
        busy_above=rule.busy_above,
        for_s=rule.for_duration.seconds,
        temperature_limit=temperature_limit,
        min_pod_age_s=min_pod_age_s,
    )


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def robust_spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, scaled MAD) of the values."""
    centre = median(values)
    return centre, MAD_SCALE * median([abs(v - centre) for v in values])


@dataclass(frozen=True, slots=True)
class Shortfall:
    signal: Signal
    label: str
    value: float
    median: float

    @property
    def fraction(self) -> float:
        return (self.median - self.value) / self.median


def outliers_below(values: Mapping[str, float], mad_factor: float, min_shortfall: float) -> dict[str, float]:
    """Keys whose value is more than ``mad_factor`` scaled MADs AND more than ``min_shortfall`` of
    the median below the median, with that median (empty when the median is not positive)."""
    centre, spread = robust_spread(list(values.values()))
    if not centre > 0.0:
        return {}
    return {
        key: centre
        for key, value in values.items()
        if centre - value > mad_factor * spread and centre - value > min_shortfall * centre
    }


@dataclass(frozen=True, slots=True)
class Straggler:
    pod: PodView
    sample: GPUSample
    worst: Shortfall
    cause: str  # the annotation's words (stable while the cause holds)
    evidence: str  # numbers behind the cause, for the events
    hardware: bool

    @property
    def percent(self) -> int:
        return round(100 * self.worst.fraction)

    def identity(self) -> str:
        return (
            f"{self.pod.namespace}/{self.pod.name} on node {self.sample.node} GPU {self.sample.index} "
            f"({self.sample.uuid})"
        )

    def entry(self) -> str:
        w = self.worst
        return (
            f"{self.identity()} is {self.percent}% slower than its group "
            f"({w.label} {_num(w.value)} vs median {_num(w.median)}); cause: {self.cause}"
        )


def _num(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.0f}"


def _mask(stats: Stats | None) -> int | None:
    """The clock-event bits seen in the window (its max and last values), None when unreadable."""
    if stats is None:
        return None
    bits = 0
    for value in (stats.max, stats.last):
        if not (value >= 0 and math.isfinite(value) and float(value).is_integer()):
            return None
        bits |= int(value)
    return bits


#: Clock-event causes, strongest first: (bits, the annotation's words).
_EVENT_CAUSES: tuple[tuple[int, str], ...] = (
    (SW_THERMAL | HW_THERMAL, "thermal slowdown"),
    (SW_POWER_CAP | HW_POWER_BRAKE, "power slowdown"),
    (HW_SLOWDOWN, "hardware slowdown (thermal or power brake)"),
)


def name_cause(
    sample: GPUSample, shortfalls: Sequence[Shortfall], peer_masks: Sequence[int], temperature_limit: float
) -> tuple[str, str, bool]:
    """(cause, evidence, hardware) of one straggler, from its own signals against its peers'.

    A clock-event bit counts only when fewer than half the group shows it: every GPU of a job at
    full load may sit at its power cap, and that slows none of them relative to the others. A PCIe
    link below its maximum shows in the fault window (the sources fetch it for such GPUs only).
    """
    window = sample.stats.get(Window.ACTIVITY, {})
    mask = _mask(window.get(Signal.CLOCK_EVENTS))
    temp = window.get(Signal.GPU_TEMP)
    hottest = temp.max if temp is not None and math.isfinite(temp.max) else None
    temp_text = "" if hottest is None else f", temperature max {hottest:.0f} C"
    if mask is not None:
        common = 0  # bits at least half the group shows
        for bit in range(16):
            if sum(1 for m in peer_masks if m >> bit & 1) * 2 >= len(peer_masks):
                common |= 1 << bit
        for bits, words in _EVENT_CAUSES:
            if mask & bits & ~common:
                return words, f"clock-event bits {mask:#x}{temp_text}", True
    if hottest is not None and hottest > temperature_limit:
        return "thermal slowdown", f"temperature max {hottest:.0f} C over {temperature_limit:.0f} C", True
    link = downtrained(sample.stats.get(Window.FAULT, {}))
    if link:  # a starved GPU: its host transfers, not its clocks, hold it back
        return f"{link} (down-trained)", f"{link} over the fault lookback{temp_text}", True
    clock = next((s for s in shortfalls if s.signal is Signal.SM_CLOCK), None)
    if clock is not None:
        return (
            "lower SM clock with no clock event",
            f"SM clock {clock.value:.0f} MHz vs median {clock.median:.0f} MHz, no slowdown bit{temp_text}",
            True,
        )
    return NO_HARDWARE, "its clocks match its peers: it gets less work or waits for its input", False


@dataclass(slots=True)
class GroupJudgement:
    group: JobGroup
    judged: bool
    why: str  # why not judged ('' when judged)
    unknown: bool = False  # not judged for want of data: what the group carries is kept
    suspects: list[Straggler] = field(default_factory=list)
    gpus: tuple[GPUSample, ...] = ()  # the GPUs compared (judged groups only)
    gpu_count: int = 0


def _young(pod: PodView, now: float, min_age_s: float) -> bool:
    return pod.start_time is None or now - pod.start_time < min_age_s


def judge_group(
    group: JobGroup,
    params: StragglerParams,
    *,
    pod_gpus: Mapping[PodKey, Sequence[GPUSample]],
    bounds: Callable[[GPUSample], DataBounds],
    now: float,
    activity_of: Callable[[GPUSample], GPUActivity] | None = None,
) -> GroupJudgement:
    """The group's GPUs that are slower than its median now (before ``forDuration``).

    ``activity_of``: the cycle's cached activity of a GPU (the pod verdicts computed it already).
    """
    owner_of: dict[str, PodView] = {}
    samples: list[GPUSample] = []
    for pod in group.pods:
        for sample in pod_gpus.get((pod.namespace, pod.name), ()):
            if sample.uuid not in owner_of:
                owner_of[sample.uuid] = pod
                samples.append(sample)
    n = len(samples)
    if n < params.min_gpus:
        return GroupJudgement(group, False, f"{n} GPUs, fewer than minGpus {params.min_gpus}", gpu_count=n)
    if any(_young(pod, now, params.min_pod_age_s) for pod in group.pods):
        return GroupJudgement(group, False, "warming up: a pod is younger than minPodAge", gpu_count=n)
    activity = [activity_of(s) if activity_of else gpu_activity(s, bounds(s)) for s in samples]
    known = [a.avg for a in activity if a.signal is not None]
    if len(known) < params.min_gpus:
        why = f"activity known for {len(known)} GPUs only"
        return GroupJudgement(group, False, why, unknown=True, gpu_count=n)
    busy = median(known)
    if busy < params.busy_above:
        why = f"not busy: median activity {busy:.3f} < busyAbove {params.busy_above}"
        return GroupJudgement(group, False, why, gpu_count=n)
    windows = [(s.uuid, s.stats.get(Window.ACTIVITY, {}), bounds(s)) for s in samples]
    shortfalls: dict[str, list[Shortfall]] = {}
    for signal, upper, label in COMPARED:
        values: dict[str, float] = {}
        for uuid, window, limits in windows:
            stats = usable(window.get(signal), upper, limits)
            if stats is not None:
                values[uuid] = stats.avg
        if len(values) < params.min_gpus:
            continue
        if signal in _RATIOS and median(list(values.values())) < MIN_RATIO_MEDIAN:
            continue
        for uuid, centre in outliers_below(values, params.mad_factor, params.min_shortfall).items():
            shortfalls.setdefault(uuid, []).append(Shortfall(signal, label, values[uuid], centre))
    judgement = GroupJudgement(group, True, "", gpus=tuple(samples), gpu_count=n)
    if not shortfalls:
        return judgement
    masks = [m for m in (_mask(window.get(Signal.CLOCK_EVENTS)) for _, window, _ in windows) if m is not None]
    by_uuid = {s.uuid: s for s in samples}
    for uuid, found in shortfalls.items():
        sample = by_uuid[uuid]
        worst = max(found, key=lambda s: s.fraction)
        cause, evidence, hardware = name_cause(sample, found, masks, params.temperature_limit)
        judgement.suspects.append(Straggler(owner_of[uuid], sample, worst, cause, evidence, hardware))
    judgement.suspects.sort(key=lambda s: (s.pod.name, s.sample.index, s.sample.uuid))
    return judgement


# ---- what to write ---------------------------------------------------------------------------------


def _entries(text: str) -> dict[str, int]:
    """An annotation's entries without their slowdown, each with its slowdown in percent."""
    out: dict[str, int] = {}
    for entry in text.split(SEPARATOR) if text else ():
        match = _SLOWER.search(entry)
        out[_SLOWER.sub("", entry)] = int(match.group(1)) if match else -1
    return out


def _settled(current: str, desired: str) -> bool:
    """The same stragglers and causes, every slowdown within PERCENT_TOLERANCE points."""
    old, new = _entries(current), _entries(desired)
    return old.keys() == new.keys() and all(abs(old[k] - new[k]) < PERCENT_TOLERANCE for k in new)


@dataclass(slots=True)
class StragglerOutcome:
    patches: dict[PodKey, dict[str, str | None]] = field(default_factory=dict)
    events: list[Action] = field(default_factory=list)
    groups: list[tuple[str, str, int]] = field(default_factory=list)  # (namespace, group, stragglers)
    notes: list[str] = field(default_factory=list)
    judgements: list[GroupJudgement] = field(default_factory=list)
    confirmed: set[str] = field(default_factory=set)  # UUIDs of the stragglers reported this cycle

    def views(self) -> tuple[StragglerGroupView, ...]:
        """Every group seen, for report and explain."""
        return tuple(
            StragglerGroupView(
                namespace=j.group.namespace,
                name=j.group.name,
                pods=tuple(p.name for p in j.group.pods),
                gpus=j.gpu_count,
                judged=j.judged,
                why=j.why,
                slower=tuple(s.entry() for s in j.suspects),
                reported=tuple(s.entry() for s in j.suspects if s.sample.uuid in self.confirmed),
            )
            for j in self.judgements
        )


def _patch(out: StragglerOutcome, pod: PodView, key: str, value: str | None) -> None:
    if pod.annotations.get(key) != value:
        out.patches.setdefault((pod.namespace, pod.name), {})[key] = value


def _carries(pod: PodView) -> bool:
    annotations = pod.annotations
    return names.STRAGGLER in annotations or names.STRAGGLER_SINCE in annotations


def _clear_all(pods: Sequence[PodView], out: StragglerOutcome) -> None:
    for pod in pods:
        for key in (names.STRAGGLER, names.STRAGGLER_SINCE):
            if key in pod.annotations:
                _patch(out, pod, key, None)


def _report(judgement: GroupJudgement, params: StragglerParams, now: float, out: StragglerOutcome) -> None:
    """Since-clocks, the group annotation and the events of one judged (or idle) group."""
    group = judgement.group
    suspects_by_pod: dict[str, list[Straggler]] = {}
    for s in judgement.suspects:
        suspects_by_pod.setdefault(s.pod.name, []).append(s)
    confirmed: list[Straggler] = []
    for pod in group.pods:
        mine = suspects_by_pod.get(pod.name)
        since_text = pod.annotations.get(names.STRAGGLER_SINCE)
        if not mine:
            if since_text is not None:
                _patch(out, pod, names.STRAGGLER_SINCE, None)
            continue
        since = parse_rfc3339(since_text)
        if since is None or since > now:
            since = now
            _patch(out, pod, names.STRAGGLER_SINCE, format_rfc3339(now))
        if now - since >= params.for_s:
            confirmed.extend(mine)
    out.confirmed.update(s.sample.uuid for s in confirmed)
    desired = SEPARATOR.join(s.entry() for s in confirmed)
    reference = next((p.annotations.get(names.STRAGGLER, "") for p in group.pods), "")
    value = reference if reference and _settled(reference, desired) else desired
    for pod in group.pods:
        current = pod.annotations.get(names.STRAGGLER, "")
        if value != current and not (current and value and _settled(current, value)):
            _patch(out, pod, names.STRAGGLER, value or None)
    if judgement.judged:
        out.groups.append((group.namespace, group.name, len(confirmed)))
    _events(group, confirmed, params, out)


def _events(
    group: JobGroup, confirmed: Sequence[Straggler], params: StragglerParams, out: StragglerOutcome
) -> None:
    """Events for what changed: read from each straggling pod's own annotation (what was reported)."""
    new: list[Straggler] = []
    for s in confirmed:
        reported = _entries(s.pod.annotations.get(names.STRAGGLER, ""))
        if _SLOWER.sub("", s.entry()) not in reported:
            new.append(s)
    for s in new:
        message = (
            f"GPU {s.sample.index} ({s.sample.uuid}) on node {s.sample.node} is {s.percent}% slower than "
            f"the median of {group.name} ({s.worst.label} {_num(s.worst.value)} vs {_num(s.worst.median)}, "
            f"for {format_duration(params.for_s)}); the whole job runs at its speed. Cause: {s.cause} "
            f"({s.evidence})"
        )
        out.events.append(
            PodEvent(
                namespace=s.pod.namespace,
                name=s.pod.name,
                uid=s.pod.uid,
                reason=names.EV_STRAGGLER,
                message=message,
                type="Warning",
            )
        )
        if s.hardware:
            out.events.append(
                NodeEvent(
                    node=s.sample.node,
                    reason=names.EV_STRAGGLER,
                    message=f"{message}; pod {s.pod.namespace}/{s.pod.name}",
                )
            )
        out.notes.append(f"straggler in {group.namespace}/{group.name}: {s.entry()}")
    if new and group.owner is not None:
        listed = "; ".join(
            f"pod {s.pod.name} GPU {s.sample.index} on {s.sample.node} {s.percent}% slower ({s.cause})"
            for s in new
        )
        out.events.append(
            OwnerEvent(
                namespace=group.namespace,
                owner=group.owner,
                reason=names.EV_STRAGGLER,
                message=f"{len(new)} straggling GPU(s) hold back {group.name}: {listed}",
            )
        )
    still = {_SLOWER.sub("", s.entry()) for s in confirmed}
    for pod in group.pods:
        mine = [
            k
            for k in _entries(pod.annotations.get(names.STRAGGLER, ""))
            if k.startswith(f"{pod.namespace}/{pod.name} on ")
        ]
        gone = [k for k in mine if k not in still]
        if gone:
            out.events.append(
                PodEvent(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    reason=names.EV_STRAGGLER_CLEARED,
                    message=f"no longer slower than the median of {group.name}: {'; '.join(gone)}",
                    type="Normal",
                )
            )


def evaluate_stragglers(
    snapshot: Snapshot,
    pods: Sequence[PodView],
    params: StragglerParams,
    *,
    pod_gpus: Mapping[PodKey, Sequence[GPUSample]],
    bounds_of: Callable[[GPUSample], DataBounds],
    activity_of: Callable[[GPUSample], GPUActivity] | None = None,
) -> StragglerOutcome:
    """Group the in-scope pods, judge each group, and plan the annotations and events.

    Groups whose data is insufficient keep what they carry (no evidence either way); idle, warming-up
    and too-small groups lose their straggler annotations (nothing is held back now).
    """
    out = StragglerOutcome()
    if not params.enabled:
        _clear_all(pods, out)
        return out
    grouped: set[PodKey] = set()
    for group in job_groups(pods, params.group_by, snapshot.owners):
        grouped.update((p.namespace, p.name) for p in group.pods)
        judgement = judge_group(
            group, params, pod_gpus=pod_gpus, bounds=bounds_of, now=snapshot.now, activity_of=activity_of
        )
        out.judgements.append(judgement)
        if judgement.unknown:
            continue
        if not judgement.suspects and not any(_carries(p) for p in group.pods):
            if judgement.judged:  # nothing slow, nothing said before: nothing to write or say
                out.groups.append((group.namespace, group.name, 0))
            continue
        _report(judgement, params, snapshot.now, out)
    _clear_all([p for p in pods if (p.namespace, p.name) not in grouped], out)
    return out


def straggler_judgements(
    outcome: StragglerOutcome, holding: Container[str] | None = None
) -> list[GpuJudgement]:
    """The fault engine's view of every GPU of a judged group (``faults.kinds.FaultKind.STRAGGLER``).

    FAULT: a reported straggler with a hardware cause (the node is to blame); PENDING: slower than
    its group but not reported yet, or for no hardware cause (neither a fault nor a recovery);
    HEALTHY: at its group's speed. GPUs of groups not judged this cycle (idle, warming up, too few
    GPUs, unknown data) are left out: no evidence either way, so a held straggler stays held.
    ``holding``: the nodes whose fault record names a straggler; a HEALTHY GPU elsewhere changes
    nothing (it can only release a hold or age a baseline), so it is left out (None: all nodes).
    """
    out: list[GpuJudgement] = []
    for judgement in outcome.judgements:
        if not judgement.judged:
            continue
        suspects = {s.sample.uuid: s for s in judgement.suspects}
        for sample in judgement.gpus:
            suspect = suspects.get(sample.uuid)
            if suspect is None and holding is not None and sample.node not in holding:
                continue
            state, summary, fingerprint = GpuState.HEALTHY, "", {}
            if suspect is not None:
                hardware = suspect.hardware and sample.uuid in outcome.confirmed
                state = GpuState.FAULT if hardware else GpuState.PENDING
                summary = f"{suspect.percent}% slower than {judgement.group.name}: {suspect.cause}"
                fingerprint = {"percent": float(suspect.percent)}
            out.append(
                GpuJudgement(
                    kind=FaultKind.STRAGGLER,
                    node=sample.node,
                    uuid=sample.uuid,
                    index=sample.index,
                    state=state,
                    summary=summary,
                    fingerprint=fingerprint,
                    reason=""
                    if state is not GpuState.PENDING
                    else "slower than its group, not a reported hardware straggler",
                )
            )
    return out


__all__ = [
    "StragglerOutcome",
    "StragglerParams",
    "evaluate_stragglers",
    "judge_group",
    "name_cause",
    "outliers_below",
    "robust_spread",
    "straggler_judgements",
    "straggler_params",
]
