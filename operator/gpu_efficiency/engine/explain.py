"""Plain-text explanation of one pod's verdict, for the CLI ``explain`` command."""

from __future__ import annotations

import math

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.evaluation import Evaluation
from gpu_efficiency.engine.model import EvictPod, GPUSample, ReclaimOwner, Snapshot, Window
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.activity import ACTIVITY_CHAIN, data_bounds, insufficiency


def _num(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def _thresholds(params: CycleParams) -> list[str]:
    u = params.under
    return [
        f"  mode: {'Enforce' if params.enforce else 'Observe'}; window {format_duration(params.window_s)}; "
        f"minCoverage {params.min_coverage}; maxStaleness {format_duration(params.max_staleness_s)}",
        f"  idle: enabled={params.idle_enabled} activityBelow={params.activity_below} "
        f"idleFor={format_duration(params.idle_for_s)} "
        f"warningPeriod={format_duration(params.warning_period_s)} "
        f"allowOptOut={params.allow_opt_out} allowKeepUntil={params.allow_keep_until} "
        f"maxKeep={format_duration(params.max_keep_s)}",
        f"  underutilization: enabled={u.enabled} lowActivityBelow={u.low_activity_below} "
        f"fakeLoadGpuUtilAbove={u.fake_load_gpu_util_above} memoryBoundDramAbove={u.memory_bound_dram_above} "
        f"inputStarvedPcieRx={u.input_starved_pcie_rx_bytes_per_second:g}B/s "
        f"oscillationStddevAbove={u.oscillation_stddev_above} "
        f"communication={u.communication_bytes_per_second:g}B/s "
        f"lowOccupancy=sm>{u.low_occupancy_sm_active_above}&occ<{u.low_occupancy_below} "
        f"noTensor=sm[{u.no_tensor_sm_active_min},{u.no_tensor_sm_active_max}]"
        f"&tensor<{u.no_tensor_tensor_below} "
        f"temperatureLimit={u.temperature_limit_celsius}C memoryPressure={u.memory_pressure_fraction} "
        f"efficientSmActiveAbove={u.efficient_sm_active_above}",
        f"  eviction: maxPerCycle={params.max_per_cycle} maxPerHour={params.max_per_hour} "
        f"maxPerNamespacePerCycle={params.max_per_namespace} "
        f"minPodAge={format_duration(params.min_pod_age_s)} "
        f"allowBarePods={params.allow_bare_pods} priorityThreshold={params.priority_threshold}",
    ]


def _gpu_lines(sample: GPUSample, params: CycleParams, now: float) -> list[str]:
    bounds = data_bounds(sample, params, now)
    carried = sample.carried_newest
    lines = [
        f"  GPU {sample.uuid} (index {sample.index}, {sample.model or 'unknown model'}, node {sample.node}, "
        f"source {sample.source}); {bounds.needed:.0f} samples needed, newest no older than "
        f"{format_rfc3339(now - params.max_staleness_s)}"
        + ("" if carried is None else "; activity window carried from an earlier fetch")
    ]
    window = sample.stats.get(Window.ACTIVITY, {})
    for signal, upper, _ in ACTIVITY_CHAIN:
        stats = window.get(signal)
        problem = insufficiency(stats, upper, bounds)
        if stats is None:
            lines.append(f"    {signal.value}: absent")
        else:
            ts = stats.last_timestamp
            if carried is not None and math.isfinite(ts):
                ts = carried  # judged by the GPU's newest sample time (activity.carried_bounds)
            newest = format_rfc3339(ts) if math.isfinite(ts) else "?"
            lines.append(
                f"    {signal.value}: avg {_num(stats.avg)} max {_num(stats.max)} count {stats.count} "
                f"newest {newest} -> {problem or 'usable'}"
            )
    others = [
        f"{s.name}={_num(st.avg)}" for s, st in window.items() if s not in {c[0] for c in ACTIVITY_CHAIN}
    ]
    if others:
        lines.append(f"    other averages: {', '.join(others)}")
    return lines


def explain_lines(snapshot: Snapshot, evaluation: Evaluation, namespace: str, name: str) -> list[str]:
    """Every signal, threshold and rule behind the pod's verdict, lifecycle and actions."""
    params = evaluation.params
    who = f"{namespace}/{name}"
    lines = [f"pod {who} under policy {snapshot.policy_name} at {format_rfc3339(snapshot.now)}"]
    pod = next((p for p in snapshot.pods if p.namespace == namespace and p.name == name), None)
    if pod is None:
        return [*lines, "  not found among the GPU pods of this snapshot"]
    lines.append(
        f"  node {pod.node or '-'}, phase {pod.phase}, GPUs requested {pod.gpu_request}, "
        f"controller {pod.controller_kind or 'none (bare pod)'}, priority {pod.priority}"
    )
    if evaluation.exclusion:
        return [*lines, f"  out of scope: {evaluation.exclusion}"]
    record = evaluation.record
    if record is None:
        return [*lines, "  not evaluated"]
    lines.append("thresholds:")
    lines.extend(_thresholds(params))
    lines.append("GPUs (activity chain SM_ACTIVE -> GR_ENGINE_ACTIVE -> GPU_UTIL/100):")
    samples = [g for g in snapshot.gpus if any(r.namespace == namespace and r.name == name for r in g.pods)]
    if not samples:
        lines.append("  none: no DCGM sample carries this pod's labels")
    for sample in samples:
        lines.extend(_gpu_lines(sample, params, snapshot.now))
        co_tenants = sorted({f"{r.namespace}/{r.name}" for r in sample.pods} - {who})
        if co_tenants:
            lines.append(f"    shared with: {', '.join(co_tenants)}")
    for activity in record.activities:
        state = (
            f"activity from {activity.signal.value}: peak {activity.peak:.3f}, avg {activity.avg:.3f}"
            if activity.signal is not None
            else f"Unknown: {activity.unknown_reason}"
        )
        lines.append(f"  GPU {activity.uuid}: {state}")
    for finding in record.findings:
        lines.append(f"  finding: {finding.diagnosis.value}: {finding.evidence}")
    if record.sharing:
        lines.append(f"  sharing rule: {record.sharing}")
    verdict = record.verdict
    lines.append(f"verdict: {verdict.verdict.value} ({verdict.diagnosis.value}): {verdict.reason}")
    if verdict.recommendation:
        lines.append(f"  recommendation: {verdict.recommendation}")
    if verdict.efficiency is not None:
        lines.append(f"  efficiency: {verdict.efficiency:.0f} (activity / GPU_UTIL x 100)")
    lifecycle = record.lifecycle
    clock = {
        k: pod.annotations[k]
        for k in (names.IDLE_SINCE, names.EVICT_AFTER, names.KEEP_UNTIL, names.KEEP_FOR)
        if k in pod.annotations
    }
    lines.append(f"idle lifecycle: current {clock or 'no idle state'}")
    if lifecycle is not None and lifecycle.hold:
        lines.append(f"  held: {lifecycle.hold}")
    for note in lifecycle.notes if lifecycle is not None else ():
        lines.append(f"  bookkeeping: {note}")
    for key, value in record.patch.items():
        lines.append(f"  annotate {key} = {value if value is not None else '(remove)'}")
    for event in record.events:
        lines.append(f"  event {event.type} {event.reason}: {event.message}")
    evicted = [
        a
        for a in evaluation.plan.actions
        if isinstance(a, EvictPod) and (a.namespace, a.name) == (namespace, name)
    ]
    if evicted:
        lines.append(f"  EVICT: {evicted[0].reason}")
    if record.owner:
        lines.append(f"  {record.owner}")
    reclaimed = [
        a
        for a in evaluation.plan.actions
        if isinstance(a, ReclaimOwner) and a.namespace == namespace and any(n == name for n, _ in a.pods)
    ]
    if reclaimed:
        owner = reclaimed[0].owner
        lines.append(
            f"  {reclaimed[0].action.upper()} {owner.kind.lower()}/{owner.name}: {reclaimed[0].reason}"
        )
    about = (f"{who}:", f"{namespace}/{record.owner_label}:") if record.owner_label else (f"{who}:",)
    lines.extend(f"  note: {note}" for note in evaluation.plan.notes if note.startswith(about))
    lines.extend(_straggler_lines(evaluation, namespace, name))
    return lines


def _straggler_lines(evaluation: Evaluation, namespace: str, name: str) -> list[str]:
    """The pod's job group as the straggler pass saw it (nothing when stragglers are off)."""
    group = next(
        (g for g in evaluation.plan.straggler_groups if g.namespace == namespace and name in g.pods), None
    )
    if group is None:
        return []
    state = "judged" if group.judged else f"not judged: {group.why}"
    lines = [f"straggler group {group.name}: {len(group.pods)} pods, {group.gpus} GPUs, {state}"]
    reported = set(group.reported)
    for entry in group.slower:
        what = "reported" if entry in reported else "slower now, not yet for forDuration"
        lines.append(f"  {what}: {entry}")
    if group.judged and not group.slower:
        lines.append("  no GPU is slower than the group's median")
    return lines
