"""The judge memo: verdicts kept from the previous cycle change no plan, only how much is recomputed."""

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, GPUSample, Plan, Snapshot, Verdict, Window
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo

pytestmark = pytest.mark.usefixtures("no_faults")

PROFILES = [b.idle, b.compute_bound, b.memory_bound, b.fake_load, b.thermal_throttled, b.bursty_inference]
FETCHED_AT = NOW - 600.0  # the carried windows were fetched ten minutes before the first cycle


def carried(sample: GPUSample, now: float) -> GPUSample:
    """What the tiered source hands the engine for a carried GPU: the same window objects, with
    identity's newest sample time of this cycle."""
    return replace(sample, carried_newest=now - 10.0)


def cluster() -> Snapshot:
    gpus = [
        b.shift_stats(gpu(f"GPU-{i}", profile(), ("team-a", f"p{i}")), FETCHED_AT)
        for i, profile in enumerate(PROFILES)
    ]
    gpus.append(b.shift_stats(gpu("GPU-shared", b.idle(), ("team-a", "s1"), ("team-a", "s2")), FETCHED_AT))
    pods = [pod(f"p{i}") for i in range(len(PROFILES))] + [pod("s1"), pod("s2")]
    return snapshot([carried(g, NOW) for g in gpus], pods, enforce())


def next_cycle(snap: Snapshot, plan: Plan, **gpu_changes: GPUSample) -> Snapshot:
    """60 s later, the plan's annotations applied, every GPU's window carried unless replaced."""
    now = snap.now + 60.0
    after = b.apply_plan(snap, plan)
    gpus = tuple(gpu_changes.get(g.uuid.replace("-", "_"), carried(g, now)) for g in snap.gpus)
    return replace(after, now=now, gpus=gpus)


def both(snap: Snapshot, memo: JudgeMemo) -> Plan:
    """The plan with the memo, after checking it is the plan without it."""
    with_memo = plan_cycle(snap, memo)
    assert with_memo == plan_cycle(snap)
    return with_memo


def test_a_plan_with_the_memo_is_the_plan_without_it_cycle_after_cycle() -> None:
    memo = JudgeMemo()
    snap = cluster()
    plan = both(snap, memo)
    assert (memo.hits, memo.misses) == (0, len(PROFILES))  # the shared pods are never memoised

    snap = next_cycle(snap, plan)
    plan = both(snap, memo)
    assert (memo.hits, memo.misses) == (len(PROFILES), 0)

    # GPU-1 is refetched and now idle: only its pod is judged again, and its verdict follows
    refetched = carried(
        b.shift_stats(gpu("GPU-1", b.idle(), ("team-a", "p1")), snap.now + 60.0), snap.now + 60.0
    )
    snap = next_cycle(snap, plan, GPU_1=refetched)
    plan = both(snap, memo)
    assert (memo.hits, memo.misses) == (len(PROFILES) - 1, 1)
    assert {v.name: v.verdict for v in plan.verdicts}["p1"] is Verdict.IDLE

    # GPU-2's exporter stopped: identity's newest time goes stale, so its kept window no longer counts
    stale = replace(next(g for g in snap.gpus if g.uuid == "GPU-2"), carried_newest=FETCHED_AT)
    snap = next_cycle(snap, plan, GPU_2=stale)
    plan = both(snap, memo)
    assert {v.name: v.verdict for v in plan.verdicts}["p2"] is Verdict.UNKNOWN
    assert memo.misses == 1

    # the idle clock runs on the kept verdicts: the warning and the eviction come as without the memo
    actions = []
    for _ in range(12):
        snap = next_cycle(snap, plan)
        plan = both(snap, memo)
        actions.extend(plan.actions)
    assert any(
        isinstance(a, AnnotatePod) and names.EVICT_AFTER in a.annotations and a.name == "p0" for a in actions
    )
    assert any(isinstance(a, EvictPod) and a.name == "p0" for a in actions)


def test_an_edited_policy_forgets_every_kept_verdict() -> None:
    memo = JudgeMemo()
    snap = cluster()
    plan = both(snap, memo)
    assert {v.name: v.verdict for v in plan.verdicts}["p3"] is Verdict.UNDERUTILIZED
    edited = replace(next_cycle(snap, plan), policy=enforce(idle={"activity_below": 0.1}))
    plan = both(edited, memo)
    assert memo.hits == 0
    assert {v.name: v.verdict for v in plan.verdicts}["p3"] is Verdict.IDLE  # fake load: peak 0.08


def test_a_recreated_pod_warms_up_again_though_its_gpu_window_is_kept() -> None:
    memo = JudgeMemo()
    snap = cluster()
    plan = both(snap, memo)
    assert {v.name: v.verdict for v in plan.verdicts}["p0"] is Verdict.IDLE
    snap = next_cycle(snap, plan)
    young = tuple(replace(p, start_time=snap.now - 30.0) if p.name == "p0" else p for p in snap.pods)
    plan = both(replace(snap, pods=young), memo)
    p0 = {v.name: v for v in plan.verdicts}["p0"]
    assert p0.verdict is Verdict.UNKNOWN
    assert "warming up" in p0.reason


def test_equal_windows_in_new_objects_are_reused_and_different_ones_are_not() -> None:
    memo = JudgeMemo()
    snap = cluster()
    plan = both(snap, memo)
    copies = tuple(
        replace(g, stats={w: dict(s) for w, s in g.stats.items()}, carried_newest=snap.now + 50.0)
        for g in snap.gpus
    )
    snap = replace(next_cycle(snap, plan), gpus=copies)
    plan = both(snap, memo)
    assert memo.hits == len(PROFILES)
    window = dict(snap.gpus[3].stats[Window.ACTIVITY])
    window.update(b.compute_bound())
    changed = replace(snap.gpus[3], stats={Window.ACTIVITY: window})
    snap = next_cycle(snap, plan, GPU_3=changed)
    plan = both(snap, memo)
    assert (memo.hits, memo.misses) == (len(PROFILES) - 1, 1)
    assert {v.name: v.verdict for v in plan.verdicts}["p3"] is Verdict.EFFICIENT


def test_windows_fetched_this_cycle_are_neither_reused_nor_kept() -> None:
    memo = JudgeMemo()
    snap = cluster()
    fetched = replace(snap, gpus=tuple(replace(g, carried_newest=None) for g in snap.gpus))
    plan = both(fetched, memo)
    assert (memo.hits, memo.misses) == (0, 0)
    both(next_cycle(fetched, plan), memo)  # carried from now on: judged, since nothing was kept
    assert (memo.hits, memo.misses) == (0, len(PROFILES))


def quiet_verdicts(plan: Plan) -> int:
    """Pods judged Active, Efficient or Underutilized alone on their GPU: those that can be quiet."""
    return sum(
        1
        for v in plan.verdicts
        if v.verdict not in (Verdict.IDLE, Verdict.UNKNOWN) and v.name.startswith("p")
    )


def test_a_quiet_pod_is_not_acted_on_again_while_its_view_and_verdict_stay() -> None:
    memo = JudgeMemo()
    snap = cluster()
    plan = both(snap, memo)  # the first annotations: no pod is quiet yet
    snap = next_cycle(snap, plan)
    plan = both(snap, memo)  # new views (annotated): acted on, and found quiet
    assert memo.quiet == 0
    snap = next_cycle(snap, plan)
    plan = both(snap, memo)
    assert memo.quiet == quiet_verdicts(plan) >= 3
    assert not [a for a in plan.actions if isinstance(a, AnnotatePod)]

    # an owner removes p1's state annotation: a new view, acted on again, and the state comes back
    edited = tuple(
        replace(p, annotations={k: v for k, v in p.annotations.items() if k != names.STATE})
        if p.name == "p1"
        else p
        for p in snap.pods
    )
    snap = replace(next_cycle(snap, plan), pods=edited)
    plan = both(snap, memo)
    assert memo.quiet == quiet_verdicts(plan) - 1
    restored = [a for a in plan.actions if isinstance(a, AnnotatePod) and a.name == "p1"]
    assert [a.annotations for a in restored] == [{names.STATE: "Efficient"}]


def test_a_new_verdict_on_the_same_view_is_acted_on_and_a_failed_write_is_retried() -> None:
    memo = JudgeMemo()
    snap = cluster()
    for _ in range(3):
        plan = both(snap, memo)
        snap = next_cycle(snap, plan)
    assert {v.name: v.verdict for v in plan.verdicts}["p1"] is Verdict.EFFICIENT
    # GPU-1 is refetched idle: the same view of p1, a new verdict, so its actions are recomputed
    refetched = carried(
        b.shift_stats(gpu("GPU-1", b.idle(), ("team-a", "p1")), snap.now + 60.0), snap.now + 60.0
    )
    snap = next_cycle(snap, plan, GPU_1=refetched)
    for _ in range(2):  # the write fails: the next cycle has the same view, and patches it again
        plan = both(snap, memo)
        assert {v.name: v.verdict for v in plan.verdicts}["p1"] is Verdict.IDLE
        patch = next(a for a in plan.actions if isinstance(a, AnnotatePod) and a.name == "p1")
        assert patch.annotations[names.STATE] == "Idle"
        snap = replace(snap, now=snap.now + 60.0, gpus=tuple(carried(g, snap.now + 60.0) for g in snap.gpus))
