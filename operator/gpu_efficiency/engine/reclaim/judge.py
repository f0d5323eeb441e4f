"""Judging one pod from its GPUs' activity windows: Idle, Underutilized, Efficient or Unknown.

Each GPU's activity and data bounds are worked out once per cycle (``JudgeContext``) and shared by
every pod on it, the sharing rule and the straggler pass; a verdict is reused from the previous cycle
(judgememo.py) when the pod's inputs are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    Diagnosis,
    GPUSample,
    PodVerdict,
    PodView,
    Signal,
    Stats,
    Verdict,
    Window,
)
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.activity import (
    ACTIVITY_CHAIN,
    DataBounds,
    GPUActivity,
    carried_bounds,
    gpu_activity,
    gpu_util_fraction,
)
from gpu_efficiency.engine.reclaim.idle import (
    GPUState,
    PodKey,
    below_idle_threshold,
    gpu_state,
    idle_rule,
    is_shared,
    shared_idleness,
)
from gpu_efficiency.engine.reclaim.judgememo import JudgeInputs, JudgeMemo, Judgement
from gpu_efficiency.engine.reclaim.record import PodRecord
from gpu_efficiency.engine.reclaim.underutilization import RECOMMENDATIONS, diagnose, verdict_of

_SIGNAL_RANK: Mapping[Signal, int] = {signal: i for i, (signal, _, _) in enumerate(ACTIVITY_CHAIN)}
#: Plain-string values of the enums, looked up instead of the slower ``.value`` descriptor.
PLAIN_VALUE: Mapping[Signal | Diagnosis | Verdict, str] = {
    member: member.value for enum in (Signal, Diagnosis, Verdict) for member in enum
}
_EMPTY: Mapping[Signal, Stats] = {}


class JudgeContext:
    """Per-cycle caches: activity per GPU, data bounds per expected sample count."""

    __slots__ = ("_activity", "_bounds", "idle_rule", "memo", "now", "params", "pod_gpus")

    def __init__(
        self,
        params: CycleParams,
        now: float,
        pod_gpus: Mapping[PodKey, list[GPUSample]],
        memo: JudgeMemo | None = None,
    ) -> None:
        self.params = params
        self.now = now
        self.pod_gpus = pod_gpus
        self.memo = memo
        self.idle_rule = idle_rule(params)
        self._activity: dict[str, GPUActivity] = {}
        self._bounds: dict[tuple[float, bool | None], DataBounds] = {}

    def bounds(self, sample: GPUSample) -> DataBounds:
        expected = sample.expected_samples.get(Window.ACTIVITY) or self.params.expected_activity_samples
        oldest = self.now - self.params.max_staleness_s
        newest = sample.carried_newest
        key = (expected, None if newest is None else newest >= oldest)  # a carried window: fresh or not
        found = self._bounds.get(key)
        if found is None:
            found = carried_bounds(
                DataBounds(needed=expected * self.params.min_coverage, oldest=oldest), newest
            )
            self._bounds[key] = found
        return found

    def activity(self, sample: GPUSample, bounds: DataBounds | None = None) -> GPUActivity:
        found = self._activity.get(sample.uuid)
        if found is None:
            found = gpu_activity(sample, bounds or self.bounds(sample))
            self._activity[sample.uuid] = found
        return found

    def gpu_state(self, sample: GPUSample) -> str:
        return gpu_state(self.activity(sample), self.params)


def index_pods(gpus: Sequence[GPUSample]) -> dict[PodKey, list[GPUSample]]:
    """GPU samples of each pod, from the exporter's pod labels (a GPU listed once per pod)."""
    pod_gpus: dict[PodKey, list[GPUSample]] = {}
    for sample in gpus:
        for ref in sample.pods:
            key = (ref.namespace, ref.name)
            samples = pod_gpus.get(key)
            if samples is None:
                pod_gpus[key] = [sample]
            elif samples[-1] is not sample:
                samples.append(sample)
    return pod_gpus


def unknown_verdict(
    pod: PodView, reason: str, uuids: tuple[str, ...] = (), recommendation: str = ""
) -> PodVerdict:
    return PodVerdict(
        namespace=pod.namespace,
        name=pod.name,
        verdict=Verdict.UNKNOWN,
        diagnosis=Diagnosis.INSUFFICIENT_DATA,
        recommendation=recommendation or RECOMMENDATIONS[Diagnosis.INSUFFICIENT_DATA],
        activity_signal=None,
        activity_peak=None,
        activity_avg=None,
        gpu_util_avg=None,
        efficiency=None,
        gpus=uuids,
        reason=reason,
    )


def _warming_up(pod: PodView, min_age_s: float) -> PodVerdict:
    """Unknown for a pod younger than minPodAge, saying so and until when (nothing is wrong yet)."""
    if pod.start_time is None:
        text = "not started yet: judged once it has run " + format_duration(min_age_s)
    else:
        text = (
            f"warming up: judged from {format_rfc3339(pod.start_time + min_age_s)}, once it has run "
            f"{format_duration(min_age_s)} (until then the window may hold the GPU's previous tenant)"
        )
    return unknown_verdict(pod, text, recommendation=text)


def judge(pod: PodView, key: PodKey, ctx: JudgeContext) -> PodRecord:
    """The pod's verdict: Unknown if a GPU lacks data, Idle if all are idle (sharing rule), else diagnosis."""
    params = ctx.params
    if pod.start_time is None or ctx.now - pod.start_time < params.min_pod_age_s:
        # Warm-up (minPodAge, default the window): the window's samples are per GPU and may still be
        # the previous tenant's, so a young pod gets no verdict and no idle clock yet.
        return PodRecord(pod, _warming_up(pod, params.min_pod_age_s))
    samples = ctx.pod_gpus.get(key)
    if not samples:
        return PodRecord(
            pod,
            unknown_verdict(
                pod, "no DCGM samples are attributed to this pod (check the exporter's pod labels)"
            ),
        )
    bounds = [ctx.bounds(s) for s in samples]
    memo = ctx.memo
    if memo is None or is_shared(samples, key) or any(s.carried_newest is None for s in samples):
        return _judge_gpus(pod, key, ctx, samples, bounds)  # only carried windows are kept by the memo
    inputs: JudgeInputs = tuple(
        [
            (s.uuid, s.stats.get(Window.ACTIVITY) or _EMPTY, b, s.fb_total_mib)
            for s, b in zip(samples, bounds, strict=True)
        ]
    )
    kept = memo.get(key, inputs)
    if kept is not None:
        return PodRecord(pod, kept.verdict, kept.activities, kept.findings)
    record = _judge_gpus(pod, key, ctx, samples, bounds)
    memo.put(key, inputs, Judgement(record.verdict, record.activities, record.findings))
    return record


def _judge_gpus(
    pod: PodView, key: PodKey, ctx: JudgeContext, samples: Sequence[GPUSample], bounds: Sequence[DataBounds]
) -> PodRecord:
    """``judge`` past the warm-up: the verdict from the pod's GPUs' activity windows."""
    params = ctx.params
    activities = tuple([ctx.activity(s, b) for s, b in zip(samples, bounds, strict=True)])
    uuids = tuple([a.uuid for a in activities])
    for activity in activities:
        if activity.signal is None:
            return PodRecord(
                pod,
                unknown_verdict(pod, f"GPU {activity.uuid}: {activity.unknown_reason}", uuids),
                activities,
            )
    windows = [s.stats.get(Window.ACTIVITY) or _EMPTY for s in samples]
    if len(activities) == 1:
        only = activities[0]
        peak, avg, signal = only.peak, only.avg, only.signal
        util = gpu_util_fraction(windows[0], bounds[0])
    else:
        peak = max([a.peak for a in activities])
        avg = sum([a.avg for a in activities]) / len(activities)
        signal = max([a.signal for a in activities if a.signal is not None], key=_SIGNAL_RANK.__getitem__)
        utils = [gpu_util_fraction(w, b) for w, b in zip(windows, bounds, strict=True)]
        known_utils = [u for u in utils if u is not None]
        util = sum(known_utils) / len(known_utils) if known_utils else None
    if signal is None:  # unreachable: every activity is known here; keeps the type checker exact
        return PodRecord(pod, unknown_verdict(pod, "no activity signal", uuids), activities)
    efficiency = None
    if util is not None and util >= 0.01 and signal is not Signal.GPU_UTIL:
        efficiency = min(100.0, avg / util * 100.0)

    sharing = ""
    if params.idle_enabled and below_idle_threshold(peak, params):
        idle_evidence = f"peak {PLAIN_VALUE[signal]} {peak:.3f}{ctx.idle_rule}"
        state = GPUState.IDLE
        if is_shared(samples, key):
            shared = shared_idleness(key, ctx.pod_gpus, ctx.gpu_state)
            state = shared.state
            sharing = (
                f"own GPUs idle but {shared.why}" if shared.why else "shared GPUs: every pod on them is idle"
            )
            if state == GPUState.UNKNOWN:
                return PodRecord(pod, unknown_verdict(pod, sharing, uuids), activities, (), sharing)
        if state == GPUState.IDLE:
            verdict = PodVerdict(
                namespace=pod.namespace,
                name=pod.name,
                verdict=Verdict.IDLE,
                diagnosis=Diagnosis.IDLE,
                recommendation=RECOMMENDATIONS[Diagnosis.IDLE],
                activity_signal=signal,
                activity_peak=peak,
                activity_avg=avg,
                gpu_util_avg=util,
                efficiency=efficiency,
                gpus=uuids,
                reason=idle_evidence,
            )
            return PodRecord(pod, verdict, activities, (), sharing)

    if not params.under_enabled:
        good = avg >= params.under.efficient_sm_active_above
        verdict = PodVerdict(
            namespace=pod.namespace,
            name=pod.name,
            verdict=Verdict.EFFICIENT if good else Verdict.UNDERUTILIZED,
            diagnosis=Diagnosis.COMPUTE_BOUND if good else Diagnosis.LOW_COMPUTE,
            recommendation="",
            activity_signal=signal,
            activity_peak=peak,
            activity_avg=avg,
            gpu_util_avg=util,
            efficiency=efficiency,
            gpus=uuids,
            reason=f"average activity {avg:.3f} (underutilization diagnosis disabled)",
        )
        return PodRecord(pod, verdict, activities, (), sharing)

    findings = tuple(
        [
            diagnose(w, a, params, b, s.fb_total_mib)
            for s, w, a, b in zip(samples, windows, activities, bounds, strict=True)
        ]
    )
    best_index = min(range(len(findings)), key=lambda i: findings[i].rank) if len(findings) > 1 else 0
    best = findings[best_index]
    where = f" on GPU {uuids[best_index]}" if len(findings) > 1 else ""
    reason = f"{PLAIN_VALUE[best.diagnosis]}{where}: {best.evidence}" + (f" ({sharing})" if sharing else "")
    verdict = PodVerdict(
        namespace=pod.namespace,
        name=pod.name,
        verdict=verdict_of(best.diagnosis, avg, params),
        diagnosis=best.diagnosis,
        recommendation=best.recommendation,
        activity_signal=signal,
        activity_peak=peak,
        activity_avg=avg,
        gpu_util_avg=util,
        efficiency=efficiency,
        gpus=uuids,
        reason=reason,
    )
    return PodRecord(pod, verdict, activities, findings, sharing)
