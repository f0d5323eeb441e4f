"""A pod's owner cannot edit its way out of reclamation (issue 19, finding 4).

Bookkeeping times in the future are ignored (or clamped), and with the operator's ledger (the idle
clocks it wrote, idleledger.py) removing or moving ``idle-since``, ``evict-after`` or
``keep-until-seen`` neither restarts a clock nor extends a bound: the annotation is restored and a
GPUIdleBookkeepingRestored event says so. Before the fix, each scenario below was never evicted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from tests.unit.engine.builders import NOW, annotations_of, apply_plan, enforce, no_faults  # noqa: F401 (fixture)
from tests.unit.engine.reclaim.test_idle_lifecycle import P, _annotate, idle_snapshot

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.explain import explain_lines
from gpu_efficiency.engine.model import EvictPod, Plan, PodEvent, Snapshot
from gpu_efficiency.engine.planner import evaluate, plan_cycle
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger

pytestmark = pytest.mark.usefixtures("no_faults")
FAR = "2099-01-01T00:00:00Z"
Edit = Callable[[Snapshot], Snapshot]


def run(snap: Snapshot, minutes: int, edit: Edit, ledger: IdleLedger | None) -> tuple[list[Plan], Snapshot]:
    """One cycle a minute; ``edit`` is the tenant's change before each cycle."""
    plans = []
    for _ in range(minutes):
        snap = edit(snap)
        plan = plan_cycle(snap) if ledger is None else plan_cycle(snap, ledger=ledger)
        plans.append(plan)
        snap = apply_plan(snap, plan)
    return plans, snap


def evicted_at(plans: list[Plan]) -> list[int]:
    return [i for i, plan in enumerate(plans) if any(isinstance(a, EvictPod) for a in plan.actions)]


def reasons(plans: list[Plan]) -> list[str]:
    return [a.reason for plan in plans for a in plan.actions if isinstance(a, PodEvent)]


def test_a_future_keep_until_seen_is_ignored() -> None:
    spec = enforce(idle={"max_keep": "10m"})
    forged = {names.KEEP_UNTIL: FAR, names.KEEP_SEEN: FAR}
    plans, _ = run(idle_snapshot(spec, forged), 21, lambda s: s, None)
    assert evicted_at(plans) == [15]  # bound 10m from now, then the 5m warning
    first = plans[0].actions
    assert any(getattr(a, "annotations", {}).get(names.KEEP_SEEN) == format_rfc3339(NOW) for a in first)


def test_a_future_evict_after_is_clamped_to_the_warning_period() -> None:
    _, warned = run(idle_snapshot(), 6, lambda s: s, None)  # warned at minute 5
    plans, _ = run(_annotate(warned, {names.EVICT_AFTER: FAR}), 10, lambda s: s, None)
    assert evicted_at(plans) == [5]


@pytest.mark.parametrize(
    ("key", "value"),
    [(names.IDLE_SINCE, None), (names.IDLE_SINCE, FAR), (names.IDLE_SINCE, "garbage")],
)
def test_editing_idle_since_every_cycle_does_not_restart_the_clock(key: str, value: str | None) -> None:
    ledger = IdleLedger()
    plans, _ = run(idle_snapshot(), 12, lambda s: _annotate(s, {key: value}), ledger)
    assert evicted_at(plans) == [10]  # idleFor 5m + warning 5m, as without edits
    assert names.EV_BOOKKEEPING_RESTORED in reasons(plans)


def test_removing_evict_after_does_not_postpone_the_eviction() -> None:
    edit: Edit = lambda s: _annotate(s, {names.EVICT_AFTER: None})  # noqa: E731
    plans, _ = run(idle_snapshot(), 12, edit, IdleLedger())
    assert evicted_at(plans) == [10]
    assert reasons(plans).count(names.EV_EVICTION_SCHEDULED) == 1  # not warned again, a period later


def test_removing_keep_until_seen_does_not_extend_the_bound() -> None:
    spec = enforce(idle={"max_keep": "10m"})
    keep = {names.KEEP_UNTIL: FAR}
    plans, _ = run(
        idle_snapshot(spec, keep), 21, lambda s: _annotate(s, {names.KEEP_SEEN: None}), IdleLedger()
    )
    assert evicted_at(plans) == [15]
    assert names.EV_BOOKKEEPING_RESTORED in reasons(plans)


def test_toggling_keep_until_does_not_restart_its_bound() -> None:
    spec = enforce(idle={"max_keep": "10m"})
    ledger = IdleLedger()

    def toggle(snap: Snapshot) -> Snapshot:  # removed every third minute, back the minute after
        minute = round((snap.now - NOW) / 60)
        return _annotate(snap, {names.KEEP_UNTIL: None if minute % 3 == 2 else FAR})

    plans, _ = run(idle_snapshot(spec, {names.KEEP_UNTIL: FAR}), 30, toggle, ledger)
    assert evicted_at(plans)
    assert names.EV_BOOKKEEPING_RESTORED not in reasons(plans)  # the operator removed it itself


def test_the_ledger_is_forgotten_after_a_break_so_another_replicas_reset_stands() -> None:
    ledger = IdleLedger()
    _, idle = run(idle_snapshot(), 4, lambda s: s, ledger)  # idle since minute 0
    # three minutes without a cycle here (another replica led, saw activity, restarted the clock)
    reset = replace(_annotate(idle, {names.IDLE_SINCE: format_rfc3339(idle.now + 170)}), now=idle.now + 180)
    plan = plan_cycle(reset, ledger=ledger)
    assert not any(isinstance(a, PodEvent) for a in plan.actions)
    assert annotations_of(apply_plan(reset, plan), *P)[names.IDLE_SINCE] == format_rfc3339(idle.now + 170)


def test_explain_says_which_bookkeeping_was_ignored() -> None:
    snap = idle_snapshot(annotations={names.IDLE_SINCE: FAR})
    evaluation = evaluate(snap, focus=P)
    lines = explain_lines(snap, evaluation, *P)
    assert any(f"bookkeeping: {names.IDLE_SINCE}={FAR} is later than" in line for line in lines)
    assert annotations_of(snap, *P)[names.IDLE_SINCE] == FAR
