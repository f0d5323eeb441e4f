"""A destructive action waits for idle evidence that reaches its deadline (safety rule 12).

A store that hides its newest data (VictoriaMetrics' ``-search.latencyOffset``, 30 s by default)
still answers with the real times of its newest samples, and those are fresh enough for a verdict:
but a pod that became busy after its newest visible sample and before ``evict-after`` must not be
reclaimed on evidence that ends before the deadline. Plain data: the newest sample's time is the
only thing that changes between the cases.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, annotations_of, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401
from tests.unit.engine.owner_builders import chain, owned, with_owners

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    AnnotatePod,
    EvictPod,
    GPUSample,
    Plan,
    ReclaimOwner,
    Signal,
    Snapshot,
    Stats,
    Verdict,
)
from gpu_efficiency.engine.planner import evaluate, plan_cycle
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger

pytestmark = pytest.mark.usefixtures("no_faults")

P = ("team-a", "p")
DEADLINE = NOW - 5  # evict-after passed five seconds ago
SCRAPE = 15.0  # the policy's default scrapeInterval


def idle_until(newest: float) -> dict[Signal, Stats]:
    """Idle readings whose newest sample is at ``newest`` (fresh: within maxStaleness of NOW)."""
    return {s: replace(v, last_timestamp=newest) for s, v in b.idle().items()}


def due(*newest: float, carried: float | None = None) -> Snapshot:
    """An idle pod warned long ago, its evict-after just passed, one GPU per ``newest`` time."""
    annotations = {
        names.IDLE_SINCE: format_rfc3339(NOW - 3600),
        names.EVICT_AFTER: format_rfc3339(DEADLINE),
        names.STATE: "Warned",
    }
    gpus: list[GPUSample] = [gpu(f"GPU-{i}", idle_until(t), P) for i, t in enumerate(newest)]
    if carried is not None:
        gpus = [replace(g, carried_newest=carried) for g in gpus]
    return snapshot(gpus, [pod("p", annotations=annotations, gpu_request=len(gpus))], enforce())


def evictions(plan: Plan) -> list[EvictPod]:
    return [a for a in plan.actions if isinstance(a, EvictPod)]


def waiting(snap: Snapshot) -> Plan:
    """The plan of a pod that must wait: Idle, still warned, not acted on, and saying why."""
    evaluation = evaluate(snap, focus=P)
    plan = evaluation.plan
    assert evictions(plan) == []
    assert [v.verdict for v in plan.verdicts] == [Verdict.IDLE]  # missing recent data is not a gap
    for action in plan.actions:  # the warning stands: its deadline and state are left as they are
        if isinstance(action, AnnotatePod):
            assert names.EVICT_AFTER not in action.annotations
            assert names.STATE not in action.annotations
    assert evaluation.record is not None
    assert evaluation.record.lifecycle is not None
    assert evaluation.record.lifecycle.warned
    assert "waiting for idle evidence" in evaluation.record.lifecycle.hold
    assert any(n.startswith("team-a/p: ") and "waiting for idle evidence" in n for n in plan.notes)
    return plan


def test_evidence_ending_before_the_deadline_waits() -> None:
    # 20 s before the deadline, 25 s old: fresh for maxStaleness (2m), and the pod may have worked since
    plan = waiting(due(DEADLINE - 20))
    assert "GPU-0" in next(n for n in plan.notes if "waiting for idle evidence" in n)


def test_evidence_reaching_the_deadline_acts() -> None:
    [evicted] = evictions(plan_cycle(due(DEADLINE)))
    assert evicted.name == "p"
    [evicted] = evictions(plan_cycle(due(NOW - 1)))
    assert evicted.name == "p"


def test_one_gpu_of_two_short_of_the_deadline_waits() -> None:
    assert len(evictions(plan_cycle(due(NOW - 1, NOW - 1)))) == 1  # positive control: both reach it
    plan = waiting(due(NOW - 1, DEADLINE - 1))
    assert "GPU-1" in next(n for n in plan.notes if "waiting for idle evidence" in n)


@pytest.mark.parametrize("ahead", [SCRAPE + 1, 3600.0, float("inf")])
def test_a_sample_from_the_future_is_no_evidence(ahead: float) -> None:
    waiting(due(NOW + ahead))
    waiting(due(NOW - 1, NOW + ahead))  # one forged GPU beside one that reaches the deadline


def test_a_sample_taken_while_the_cycle_read_its_metrics_counts() -> None:
    # the cycle's time is taken before the queries: a sample scraped meanwhile is not forged
    [evicted] = evictions(plan_cycle(due(NOW + 1)))
    assert evicted.name == "p"


def test_a_carried_window_is_judged_by_the_gpus_newest_sample_now() -> None:
    # the tiered refresh keeps an earlier window (its stats' times are old); its GPU's newest is now
    assert len(evictions(plan_cycle(due(DEADLINE - 30, carried=NOW - 1)))) == 1
    assert evictions(plan_cycle(due(NOW - 1, carried=DEADLINE - 1))) == []
    assert evictions(plan_cycle(due(NOW - 1, carried=NOW + 3600))) == []  # from the future


def test_the_wait_ends_at_the_next_sample_past_the_deadline() -> None:
    ledger = IdleLedger()
    snap = due(DEADLINE - 3)
    assert evictions(plan_cycle(snap, ledger=ledger)) == []
    later = apply_plan(snap, plan_cycle(snap, ledger=ledger), advance=15.0)  # newest now NOW + 15
    assert annotations_of(later, *P)[names.EVICT_AFTER] == format_rfc3339(DEADLINE)
    [evicted] = evictions(plan_cycle(later, ledger=ledger))
    assert evicted.name == "p"


def test_a_restart_while_waiting_neither_acts_early_nor_forgets_the_deadline() -> None:
    snap = due(DEADLINE - 3)
    plan = plan_cycle(snap, ledger=IdleLedger())
    assert evictions(plan) == []
    ledger = IdleLedger()  # a new process: only the annotations and the samples are left
    restarted = replace(apply_plan(snap, plan, advance=1.0), gpus=snap.gpus)  # newer samples still hidden
    assert evictions(plan_cycle(restarted, ledger=ledger)) == []
    assert annotations_of(restarted, *P)[names.EVICT_AFTER] == format_rfc3339(DEADLINE)
    later = apply_plan(restarted, plan_cycle(restarted, ledger=ledger), advance=5.0)  # newest NOW + 6
    [evicted] = evictions(plan_cycle(later, ledger=ledger))
    assert evicted.name == "p"


def test_an_owner_is_not_scaled_to_zero_on_evidence_short_of_its_deadline() -> None:
    def deployment(newest: float) -> Snapshot:
        snap = due(newest)
        [one] = snap.pods
        view = owned("p", ("ReplicaSet", "nb-5d9"), annotations=one.annotations)
        objects = chain(("ReplicaSet", "nb-5d9"), ("Deployment", "nb"), replicas=1)
        return with_owners(replace(snap, pods=(view,)), objects)

    def scaled(plan: Plan) -> list[str]:
        return [f"{a.owner.kind}/{a.owner.name}" for a in plan.actions if isinstance(a, ReclaimOwner)]

    assert scaled(plan_cycle(deployment(NOW - 1))) == ["Deployment/nb"]
    assert scaled(plan_cycle(deployment(DEADLINE - 20))) == []
    assert scaled(plan_cycle(deployment(NOW + 3600))) == []


def test_an_unusable_newest_time_still_makes_the_gpu_unknown() -> None:
    # stale beyond maxStaleness: Unknown as before (safety rule 1), the clock kept as is
    plan = plan_cycle(due(NOW - 600))
    assert evictions(plan) == []
    assert [v.verdict for v in plan.verdicts] == [Verdict.UNKNOWN]
