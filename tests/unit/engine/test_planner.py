"""Whole cycles: steady state, metrics outage, status and conditions, churn rules, faults, explain."""

import re
from dataclasses import replace

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import Condition, GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine import planner
from gpu_efficiency.engine.model import (
    AnnotatePod,
    EvictPod,
    FaultOutcome,
    PodEvent,
    PolicyEvent,
    QuarantinedNodeRecord,
    Signal,
    Snapshot,
    TaintNode,
    UntaintNode,
    Verdict,
)
from gpu_efficiency.engine.planner import explain_pod, plan_cycle
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    NOW,
    annotations_of,
    apply_plan,
    enforce,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    pod,
    snapshot,
    stats,
    with_signals,
)

pytestmark = pytest.mark.usefixtures("no_faults")

PROFILES = [
    b.idle,
    b.idle_holding_memory,
    b.compute_bound,
    b.memory_bound,
    b.input_starved,
    b.communication_bound,
    b.low_occupancy,
    b.no_tensor_cores,
    b.fake_load,
    b.bursty_inference,
    b.thermal_throttled,
]


def mixed_cluster(spec: GPUEfficiencyPolicySpec | None = None) -> Snapshot:
    gpus = [gpu(f"GPU-{i}", profile(), ("team-a", f"p{i}")) for i, profile in enumerate(PROFILES)]
    gpus.append(gpu("GPU-gap", {}, ("team-a", "gap")))
    pods = [pod(f"p{i}") for i in range(len(PROFILES))] + [pod("gap"), pod("unlabelled")]
    return snapshot(gpus, pods, spec or enforce())


def test_first_cycle_annotates_every_pod_and_counts_verdicts() -> None:
    plan = plan_cycle(mixed_cluster())
    annotated = {a.name for a in plan.actions if isinstance(a, AnnotatePod)}
    assert annotated == {f"p{i}" for i in range(len(PROFILES))} | {"gap", "unlabelled"}
    counts = plan.status.verdicts
    assert (counts.idle, counts.efficient, counts.unknown) == (2, 1, 2)
    assert counts.underutilized == len(PROFILES) - 3
    assert plan.status.pods_evaluated == len(PROFILES) + 2
    assert plan.status.gpus_evaluated == len(PROFILES) + 1
    assert plan.status.idle_gpus == 2
    assert plan.status.observed_generation == 1


def test_steady_cluster_yields_zero_actions() -> None:
    snap = mixed_cluster()
    snap = apply_plan(snap, plan_cycle(snap))
    for _ in range(3):  # idleFor 5m not reached: nothing changes
        plan = plan_cycle(snap)
        assert plan.actions == ()
        snap = apply_plan(snap, plan)


def test_small_numeric_changes_do_not_rewrite_annotations() -> None:
    snap = snapshot([gpu("GPU-0", b.compute_bound(), ("team-a", "p"))], [pod("p")])
    snap = apply_plan(snap, plan_cycle(snap))
    assert annotations_of(snap, "team-a", "p")[names.SM_ACTIVE] == "0.850"
    nudged = with_signals(snap, "GPU-0", b.compute_bound() | {Signal.SM_ACTIVE: stats(0.93, 0.99)})
    assert plan_cycle(nudged).actions == ()
    moved = with_signals(snap, "GPU-0", b.compute_bound() | {Signal.SM_ACTIVE: stats(0.96, 0.99)})
    (patch,) = [a for a in plan_cycle(moved).actions if isinstance(a, AnnotatePod)]
    assert patch.annotations == {names.SM_ACTIVE: "0.960", names.EFFICIENCY: "0.980"}


def test_numbers_rewritten_when_state_changes_even_if_close() -> None:
    snap = snapshot([gpu("GPU-0", b.low_occupancy(), ("team-a", "p"))], [pod("p")])
    snap = apply_plan(snap, plan_cycle(snap))
    assert annotations_of(snap, "team-a", "p")[names.SM_ACTIVE] == "0.700"
    readings = b.low_occupancy() | {Signal.SM_OCCUPANCY: stats(0.5), Signal.SM_ACTIVE: stats(0.72, 0.8)}
    (patch,) = [
        a for a in plan_cycle(with_signals(snap, "GPU-0", readings)).actions if isinstance(a, AnnotatePod)
    ]
    assert patch.annotations[names.DIAGNOSIS] == "compute-bound"
    assert patch.annotations[names.STATE] == "Efficient"
    assert patch.annotations[names.SM_ACTIVE] == "0.720"  # 0.02 change, written because the state changed


def test_underutilized_event_only_when_diagnosis_changes() -> None:
    snap = snapshot([gpu("GPU-0", b.fake_load(), ("team-a", "p"))], [pod("p")])
    first = plan_cycle(snap)
    assert [a.reason for a in first.actions if isinstance(a, PodEvent)] == [names.EV_UNDERUTILIZED]
    snap = apply_plan(snap, first)
    assert plan_cycle(snap).actions == ()
    other = plan_cycle(with_signals(snap, "GPU-0", b.memory_bound()))
    assert [a.reason for a in other.actions if isinstance(a, PodEvent)] == [names.EV_UNDERUTILIZED]


def test_unknown_keeps_last_diagnosis_and_numbers() -> None:
    snap = snapshot([gpu("GPU-0", b.fake_load(), ("team-a", "p"))], [pod("p")])
    snap = apply_plan(snap, plan_cycle(snap))
    gap = plan_cycle(with_signals(snap, "GPU-0", {}))
    (patch,) = [a for a in gap.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations == {names.STATE: "Unknown"}
    after_gap = apply_plan(with_signals(snap, "GPU-0", {}), gap)
    back = plan_cycle(with_signals(after_gap, "GPU-0", b.fake_load()))
    (patch,) = [a for a in back.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations == {names.STATE: "Underutilized"}
    assert not [a for a in back.actions if isinstance(a, PodEvent)]  # same diagnosis: no repeated event


def test_unknown_without_history_says_insufficient_data() -> None:
    plan = plan_cycle(snapshot([], [pod("p")]))
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.STATE] == "Unknown"
    assert patch.annotations[names.DIAGNOSIS] == "insufficient-data"
    (v,) = plan.verdicts
    assert "no DCGM samples" in v.reason


def test_metrics_unavailable_no_pod_actions_condition_and_one_event() -> None:
    snap = replace(mixed_cluster(), metrics_available=False, metrics_error="Prometheus: connection refused")
    warned = replace(
        snap,
        pods=tuple(replace(p, annotations={names.EVICT_AFTER: format_rfc3339(NOW - 600)}) for p in snap.pods),
    )
    plan = plan_cycle(warned)
    assert plan.actions == (
        PolicyEvent(
            reason=names.EV_METRICS_UNAVAILABLE,
            message="Prometheus: connection refused: no pod is judged or evicted",
            type="Warning",
        ),
    )
    assert all(v.verdict is Verdict.UNKNOWN for v in plan.verdicts)
    conditions = {c.type: c for c in plan.status.conditions}
    assert conditions[names.COND_METRICS].status == "False"
    assert conditions[names.COND_METRICS].message == "Prometheus: connection refused"
    assert conditions[names.COND_READY].status == "False"
    assert plan.status.warned_pods == len(snap.pods)
    # still down next cycle: no second event, transition time kept
    again = plan_cycle(replace(warned, now=NOW + 60, status=plan.status))
    assert again.actions == ()
    assert {c.type: c for c in again.status.conditions}[names.COND_METRICS].last_transition_time == (
        format_rfc3339(NOW)
    )
    # back up: condition flips to True
    up = plan_cycle(replace(snap, now=NOW + 120, metrics_available=True, status=again.status))
    assert {c.type: c for c in up.status.conditions}[names.COND_METRICS].status == "True"


def test_conditions_keep_transition_time_across_cycles() -> None:
    snap = mixed_cluster()
    first = plan_cycle(snap)
    later = plan_cycle(apply_plan(snap, first, advance=600))
    for condition in later.status.conditions:
        assert condition.last_transition_time == format_rfc3339(NOW)


def test_unrelated_conditions_are_preserved() -> None:
    other = Condition(type="NotificationsHealthy", status="True", reason="Sent", last_transition_time="t")
    plan = plan_cycle(replace(mixed_cluster(), status=GPUEfficiencyPolicyStatus(conditions=[other])))
    assert other.model_copy(update={"observed_generation": 1}) in plan.status.conditions


def test_fault_outcome_is_folded_in(monkeypatch: pytest.MonkeyPatch) -> None:
    record = QuarantinedNodeRecord(node="n1", kind="ecc", gpus=("GPU-0",), tainted=True, since="t")
    outcome = FaultOutcome(
        actions=(TaintNode(node="n1", kind="ecc", effect="NoSchedule"),),
        quarantined=(record,),
        breaker_open=True,
        breaker_message="3 of 10 nodes faulty",
        notes=("fault note",),
    )
    monkeypatch.setattr(planner, "evaluate_faults", lambda snapshot, stragglers=(), params=None: outcome)
    plan = plan_cycle(mixed_cluster())
    assert TaintNode(node="n1", kind="ecc", effect="NoSchedule") in plan.actions
    assert "fault note" in plan.notes
    assert plan.status.quarantined_nodes[0].node == "n1"
    breaker = {c.type: c for c in plan.status.conditions}[names.COND_BREAKER]
    assert (breaker.status, breaker.message) == ("True", "3 of 10 nodes faulty")
    assert [a.reason for a in plan.actions if isinstance(a, PolicyEvent)] == [names.EV_BREAKER]


def test_evictions_come_last() -> None:
    snap = snapshot(
        [gpu("GPU-0", b.idle(), ("team-a", "a")), gpu("GPU-1", b.idle(), ("team-a", "b"))],
        [pod("a"), pod("b", start_time=NOW - 86400 + 300)],
        enforce(),
    )
    for _ in range(10):
        snap = apply_plan(snap, plan_cycle(snap))
    plan = plan_cycle(snap)
    kinds = [type(a) for a in plan.actions]
    assert EvictPod in kinds
    assert kinds.index(EvictPod) == len(kinds) - kinds.count(EvictPod)


def test_explain_lists_signals_thresholds_and_rule() -> None:
    snap = snapshot([gpu("GPU-0", b.fake_load(), ("team-a", "p"))], [pod("p")])
    text = "\n".join(explain_pod(snap, "team-a", "p"))
    for expected in [
        "DCGM_FI_PROF_SM_ACTIVE: avg 0.05",
        "fakeLoadGpuUtilAbove=0.8",
        "verdict: Underutilized (fake-load)",
        "recommendation: the GPU runs tiny kernels",
        "annotate gpuefficiency.io/diagnosis = fake-load",
        "event Normal GPUUnderutilized",
    ]:
        assert expected in text


def test_a_carried_window_is_judged_and_explained_by_the_gpus_newest_time() -> None:
    """Stats fetched 15 minutes ago (kept by the Prometheus source's cache) with a fresh newest time
    give a verdict, explained with that time; with a stale one the pod is Unknown."""
    old = b.shift_stats(gpu("GPU-0", b.fake_load(), ("team-a", "p")), NOW - 890.0)
    assert plan_cycle(snapshot([old], [pod("p")])).verdicts[0].verdict is Verdict.UNKNOWN
    fresh = replace(old, carried_newest=NOW - 10.0)
    snap = snapshot([fresh], [pod("p")])
    assert plan_cycle(snap).verdicts[0].verdict is Verdict.UNDERUTILIZED
    text = "\n".join(explain_pod(snap, "team-a", "p"))
    assert "activity window carried from an earlier fetch" in text
    assert f"newest {format_rfc3339(NOW - 10.0)} -> usable" in text
    stale = replace(old, carried_newest=NOW - 890.0)
    assert plan_cycle(snapshot([stale], [pod("p")])).verdicts[0].verdict is Verdict.UNKNOWN


def test_explain_out_of_scope_and_missing_pods() -> None:
    snap = snapshot([], [pod("p", "kube-system")])
    assert "protected" in explain_pod(snap, "kube-system", "p")[-1]
    assert "not found" in explain_pod(snap, "x", "y")[-1]


def test_explain_during_outage() -> None:
    snap = replace(mixed_cluster(), metrics_available=False, metrics_error="down")
    assert "verdict: Unknown (insufficient-data): metrics unavailable: down" in explain_pod(
        snap, "team-a", "p0"
    )


def test_plan_is_deterministic() -> None:
    snap = mixed_cluster()
    assert plan_cycle(snap) == plan_cycle(snap)


def test_outage_runs_faults_for_manual_recovery_but_drops_taints(monkeypatch: pytest.MonkeyPatch) -> None:
    outage = FaultOutcome(
        actions=(TaintNode(node="n1", kind="ecc", effect="NoSchedule"), UntaintNode(node="n2", kind="xid")),
        quarantined=(),
        breaker_open=False,
    )
    monkeypatch.setattr(planner, "evaluate_faults", lambda snapshot, stragglers=(), params=None: outage)
    plan = plan_cycle(replace(mixed_cluster(), metrics_available=False, metrics_error="down"))
    assert UntaintNode(node="n2", kind="xid") in plan.actions
    assert not [a for a in plan.actions if isinstance(a, TaintNode | AnnotatePod | EvictPod | PodEvent)]
    assert any("taints dropped" in note for note in plan.notes)


def test_every_numeric_annotation_is_a_fraction_with_three_decimals() -> None:
    """One unit convention: sm-active, gpu-util and efficiency all read 0-1 ("0.450", "0.330")."""
    plan = plan_cycle(mixed_cluster())
    numbers = [
        (key, value)
        for a in plan.actions
        if isinstance(a, AnnotatePod)
        for key, value in a.annotations.items()
        if key in (names.SM_ACTIVE, names.GPU_UTIL, names.EFFICIENCY)
    ]
    assert {key for key, _ in numbers} == {names.SM_ACTIVE, names.GPU_UTIL, names.EFFICIENCY}
    for key, value in numbers:
        assert value is not None
        assert re.fullmatch(r"[01]\.\d{3}", value), (key, value)


def test_the_activity_signal_says_which_signal_sm_active_holds_after_a_fallback() -> None:
    no_sm = {s: v for s, v in b.idle().items() if s is not Signal.SM_ACTIVE}
    plan = plan_cycle(snapshot([gpu("GPU-0", no_sm, ("team-a", "p"))], [pod("p")], enforce()))
    (patch,) = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch[names.ACTIVITY_SIGNAL] == Signal.GR_ENGINE_ACTIVE.value


def test_underutilized_event_leads_with_plain_words() -> None:
    plan = plan_cycle(snapshot([gpu("GPU-0", b.input_starved(), ("team-a", "p"))], [pod("p")], enforce()))
    (event,) = [a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_UNDERUTILIZED]
    assert event.message.startswith("this GPU is underused (input starved): ")
    assert "Evidence: " in event.message
