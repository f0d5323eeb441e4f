"""The idle lifecycle across cycles, each plan applied to the next snapshot as the actuator would."""

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    NOW,
    annotations_of,
    apply_plan,
    enforce,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    pod,
    policy,
    snapshot,
    with_signals,
)

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    AnnotatePod,
    Diagnosis,
    EvictPod,
    Plan,
    PodEvent,
    Snapshot,
    Verdict,
)
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.underutilization import RECOMMENDATIONS

pytestmark = pytest.mark.usefixtures("no_faults")

P = ("team-a", "p")


def idle_snapshot(
    spec: GPUEfficiencyPolicySpec | None = None, annotations: dict[str, str] | None = None, **pod_fields: Any
) -> Snapshot:
    return snapshot(
        [gpu("GPU-0", b.idle(), P)], [pod("p", annotations=annotations, **pod_fields)], spec or enforce()
    )


def run(snap: Snapshot, minutes: int) -> tuple[list[Plan], Snapshot]:
    """One cycle a minute for ``minutes`` cycles; the returned snapshot is the one after the last."""
    plans = []
    for _ in range(minutes):
        plan = plan_cycle(snap)
        plans.append(plan)
        snap = apply_plan(snap, plan)
    return plans, snap


def reasons(actions: tuple[Action, ...]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, PodEvent)]


def evictions(plans: list[Plan]) -> list[EvictPod]:
    return [a for plan in plans for a in plan.actions if isinstance(a, EvictPod)]


def test_enforce_idle_warn_then_evict() -> None:
    plans, after = run(idle_snapshot(), 11)  # t = 0..10 minutes; idleFor 5m, warning 5m
    assert reasons(plans[0].actions) == [names.EV_IDLE]
    first = next(a for a in plans[0].actions if isinstance(a, AnnotatePod)).annotations
    assert first[names.IDLE_SINCE] == format_rfc3339(NOW)
    assert first[names.STATE] == "Idle"
    for quiet in plans[1:5] + plans[6:10]:
        assert quiet.actions == ()  # steady: no writes, no events
    warning = plans[5]
    assert reasons(warning.actions) == [names.EV_EVICTION_SCHEDULED]
    (event,) = [a for a in warning.actions if isinstance(a, PodEvent)]
    assert event.type == "Warning"
    assert event.message.startswith("this GPU has done no work for 15m: the pod will be evicted after")
    (patch,) = [a for a in warning.actions if isinstance(a, AnnotatePod)]
    keep = "To keep it: kubectl annotate pod p -n team-a gpuefficiency.io/keep-for=4h --overwrite"
    assert patch.annotations == {
        names.STATE: "Warned",
        names.EVICT_AFTER: format_rfc3339(NOW + 600),
        names.RECOMMENDATION: f"{RECOMMENDATIONS[Diagnosis.IDLE]}. {keep}",
    }
    assert event.message.endswith(f". {keep}")
    assert warning.status.warned_pods == 1
    (evict,) = evictions(plans)
    assert evict in plans[10].actions
    assert evict.reason.startswith("this GPU did no work for 20m")  # plain words first, numbers second
    assert "Idle since" in evict.reason
    assert "evict-after" in evict.reason
    assert (evict.namespace, evict.name, evict.uid) == ("team-a", "p", "uid-team-a-p")
    assert after.pods == ()
    assert len(after.status.recent_evictions) == 1


def test_observe_annotates_and_emits_once_but_never_warns_or_evicts() -> None:
    plans, after = run(idle_snapshot(policy()), 90)  # defaults: idleFor 30m, warning 15m
    assert reasons(plans[0].actions) == [names.EV_IDLE]
    assert all(plan.actions == () for plan in plans[1:])
    assert evictions(plans) == []
    ann = annotations_of(after, *P)
    assert names.EVICT_AFTER not in ann
    assert ann[names.STATE] == "Idle"
    assert ann[names.IDLE_SINCE] == format_rfc3339(NOW)


def test_switch_to_observe_withdraws_pending_warning() -> None:
    _, warned = run(idle_snapshot(), 6)
    assert names.EVICT_AFTER in annotations_of(warned, *P)
    observe = plan_cycle(replace(warned, policy=policy()))
    (patch,) = [a for a in observe.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations == {
        names.EVICT_AFTER: None,
        names.STATE: "Idle",
        names.RECOMMENDATION: RECOMMENDATIONS[Diagnosis.IDLE],  # without the keep command again
    }
    assert not evictions([observe])


def test_activity_during_warning_cancels_with_event() -> None:
    _, warned = run(idle_snapshot(), 7)
    busy = with_signals(warned, "GPU-0", b.compute_bound())
    plan = plan_cycle(busy)
    assert reasons(plan.actions) == [names.EV_ACTIVE_AGAIN]
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.IDLE_SINCE] is None
    assert patch.annotations[names.EVICT_AFTER] is None
    assert patch.annotations[names.STATE] == "Efficient"
    assert not evictions([plan])
    # and the next idle period starts a fresh clock
    plans, _ = run(with_signals(apply_plan(busy, plan), "GPU-0", b.idle()), 6)
    assert reasons(plans[0].actions) == [names.EV_IDLE]
    assert not evictions(plans)


def test_activity_before_warning_resets_silently() -> None:
    _, idle2 = run(idle_snapshot(), 2)
    plan = plan_cycle(with_signals(idle2, "GPU-0", b.fake_load()))
    assert reasons(plan.actions) == [names.EV_UNDERUTILIZED]
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.IDLE_SINCE] is None
    assert names.EVICT_AFTER not in patch.annotations


def test_eviction_blocked_marker_removed_on_activity_and_retried_while_idle() -> None:
    _, warned = run(idle_snapshot(), 10)
    blocked = _annotate(warned, {names.EVICTION_BLOCKED: format_rfc3339(warned.now)})
    assert len(evictions([plan_cycle(blocked)])) == 1  # retried: a 429 only postpones
    plan = plan_cycle(with_signals(blocked, "GPU-0", b.compute_bound()))
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.EVICTION_BLOCKED] is None


def _annotate(snap: Snapshot, extra: dict[str, str | None]) -> Snapshot:
    pods = []
    for p in snap.pods:
        merged = {**p.annotations, **extra}
        pods.append(replace(p, annotations={k: v for k, v in merged.items() if v is not None}))
    return replace(snap, pods=tuple(pods))


def test_unknown_keeps_the_clock_and_never_evicts() -> None:
    _, warned = run(idle_snapshot(), 7)  # warned at minute 5, evict-after at minute 10
    ann_before = dict(annotations_of(warned, *P))
    gap = with_signals(warned, "GPU-0", {})  # exporter gap
    plans, after_gap = run(gap, 10)  # well past evict-after
    assert not evictions(plans)
    ann = annotations_of(after_gap, *P)
    assert ann[names.IDLE_SINCE] == ann_before[names.IDLE_SINCE]
    assert ann[names.EVICT_AFTER] == ann_before[names.EVICT_AFTER]
    assert ann[names.STATE] == "Unknown"
    assert all(v.verdict is Verdict.UNKNOWN for plan in plans for v in plan.verdicts)
    assert reasons(plans[0].actions) == []  # no event for a data gap
    # data returns, still idle: the kept clock is past evict-after, so the pod is evicted now
    back = plan_cycle(with_signals(after_gap, "GPU-0", b.idle()))
    assert len(evictions([back])) == 1


def test_unknown_before_warning_neither_advances_nor_resets() -> None:
    _, idle3 = run(idle_snapshot(), 3)
    since = annotations_of(idle3, *P)[names.IDLE_SINCE]
    plans, after = run(with_signals(idle3, "GPU-0", {}), 20)
    assert names.EVICT_AFTER not in annotations_of(after, *P)
    assert annotations_of(after, *P)[names.IDLE_SINCE] == since
    assert not evictions(plans)


def test_opt_out_honoured_only_when_allowed() -> None:
    exempt = {names.EXEMPT: "true"}
    allowed = enforce(idle={"allow_opt_out": True})
    plans, after = run(idle_snapshot(allowed, exempt), 20)
    assert not evictions(plans)
    assert names.EVICT_AFTER not in annotations_of(after, *P)
    assert annotations_of(after, *P)[names.STATE] == "Idle"
    plans, _ = run(idle_snapshot(enforce(), exempt), 11)  # allowOptOut defaults to false
    assert len(evictions(plans)) == 1


def test_keep_until_holds_until_its_time_then_warns() -> None:
    keep = {names.KEEP_UNTIL: format_rfc3339(NOW + 20 * 60)}
    plans, after = run(idle_snapshot(annotations=keep), 20)
    assert not evictions(plans)
    first = next(a for a in plans[0].actions if isinstance(a, AnnotatePod)).annotations
    assert first[names.KEEP_SEEN] == format_rfc3339(NOW)
    assert names.EVICT_AFTER not in annotations_of(after, *P)
    plans, after = run(after, 1)  # minute 20: keep-until reached, idle for 20m >= idleFor
    assert reasons(plans[0].actions) == [names.EV_EVICTION_SCHEDULED]
    plans, _ = run(after, 6)
    assert len(evictions(plans)) == 1


def test_keep_until_bounded_by_max_keep_from_first_seen() -> None:
    spec = enforce(idle={"max_keep": "10m"})
    keep = {names.KEEP_UNTIL: "2099-01-01T00:00:00Z"}
    plans, _ = run(idle_snapshot(spec, keep), 21)
    warned_at = [i for i, plan in enumerate(plans) if names.EV_EVICTION_SCHEDULED in reasons(plan.actions)]
    assert warned_at == [10]  # seen at minute 0, bound 10m
    assert len(evictions(plans)) == 1  # minute 15 + ...
    assert evictions(plans)[0] in plans[15].actions


def test_keep_until_ignored_when_not_allowed_expired_or_invalid() -> None:
    for spec, value in [
        (enforce(idle={"allow_keep_until": False}), format_rfc3339(NOW + 3600)),
        (enforce(), format_rfc3339(NOW - 1)),
        (enforce(), "next tuesday"),
    ]:
        plans, _ = run(idle_snapshot(spec, {names.KEEP_UNTIL: value}), 11)
        assert len(evictions(plans)) == 1, value


def test_keep_until_added_during_warning_withdraws_it_and_removing_it_clears_seen() -> None:
    _, warned = run(idle_snapshot(), 7)
    acked = _annotate(warned, {names.KEEP_UNTIL: format_rfc3339(warned.now + 3600)})
    plan = plan_cycle(acked)
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.EVICT_AFTER] is None
    assert patch.annotations[names.KEEP_SEEN] == format_rfc3339(acked.now)
    assert patch.annotations[names.STATE] == "Idle"
    held = apply_plan(acked, plan)
    plan = plan_cycle(_annotate(held, {names.KEEP_UNTIL: None}))
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.KEEP_SEEN] is None
    assert names.EVICT_AFTER in patch.annotations  # idle long enough: warned again, a full period ahead


def test_never_evictable_pods_are_never_warned() -> None:
    cases: list[dict[str, Any]] = [
        {"controller_kind": "DaemonSet"},
        {"is_static": True, "controller_kind": "Node"},
        {"controller_kind": None},
        {"priority": 2_000_000_000},
    ]
    for fields in cases:
        plans, after = run(idle_snapshot(**fields), 15)
        assert not evictions(plans), fields
        assert names.EVICT_AFTER not in annotations_of(after, *P)
        assert any("never warned or evicted" in n for n in plans[-1].notes), fields


def test_bare_pod_evicted_when_allowed() -> None:
    plans, _ = run(idle_snapshot(enforce(eviction={"allow_bare_pods": True}), controller_kind=None), 11)
    assert len(evictions(plans)) == 1


def test_replaying_a_cycle_is_idempotent() -> None:
    """A restarted operator sees the same annotations and plans the same: no second warning."""
    _, warned = run(idle_snapshot(), 6)
    assert plan_cycle(warned) == plan_cycle(warned)
    assert plan_cycle(warned).actions == ()


def test_idle_disabled_clears_clock_without_events() -> None:
    _, warned = run(idle_snapshot(), 7)
    plan = plan_cycle(replace(warned, policy=enforce(idle={"enabled": False})))
    assert reasons(plan.actions) == [names.EV_UNDERUTILIZED]  # zero activity is now low compute
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.EVICT_AFTER] is None


def test_event_texts_lead_with_plain_words_and_give_numbers_second() -> None:
    plans, _ = run(idle_snapshot(), 1)
    (idle,) = [a for a in plans[0].actions if isinstance(a, PodEvent)]
    assert idle.message.startswith("this GPU has done no work for the last 10m. Evidence: peak ")
