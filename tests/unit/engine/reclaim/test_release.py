"""Release now (a self-service click writes ``gpuefficiency.io/release``): an idle, warned pod is
reclaimed at the next cycle without waiting for its deadline, through the same budgets; activity,
a hold, Observe mode or missing data never let it act."""

from __future__ import annotations

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, annotations_of, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import EvictPod, Snapshot
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger

pytestmark = pytest.mark.usefixtures("no_faults")

P = ("team-a", "p")
RELEASED = {names.RELEASE: format_rfc3339(NOW - 30)}


def warned_until_later(extra: dict[str, str], signals: object = None, mode: str = "enforce") -> Snapshot:
    """An idle pod warned with a deadline 50 minutes away, with ``extra`` annotations."""
    base = {
        names.IDLE_SINCE: format_rfc3339(NOW - 3600),
        names.EVICT_AFTER: format_rfc3339(NOW + 3000),
        names.STATE: "Warned",
    }
    idle = {"idle_for": "5m", "warning_period": "1h"}
    spec = enforce(idle=idle) if mode == "enforce" else b.policy(idle=idle)
    sample = gpu("GPU-0", signals if signals is not None else b.idle(), P)  # type: ignore[arg-type]
    return snapshot([sample], [pod("p", annotations=base | extra)], spec)


def evictions(snap: Snapshot) -> list[EvictPod]:
    return [a for a in plan_cycle(snap, ledger=IdleLedger()).actions if isinstance(a, EvictPod)]


def test_a_released_idle_pod_is_reclaimed_before_its_deadline() -> None:
    assert evictions(warned_until_later({})) == []  # the deadline is 50 minutes away
    [evicted] = evictions(warned_until_later(RELEASED))
    assert evicted.name == "p"
    assert "gave this idle GPU back" in evicted.reason


def test_activity_cancels_a_release_and_removes_it() -> None:
    snap = warned_until_later(RELEASED, signals=b.compute_bound())
    plan = plan_cycle(snap, ledger=IdleLedger())
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    assert names.RELEASE not in annotations_of(apply_plan(snap, plan), *P)


def test_a_hold_wins_over_a_release() -> None:
    assert evictions(warned_until_later(RELEASED | {names.KEEP_FOR: "2h"})) == []


def test_observe_mode_never_acts_on_a_release() -> None:
    assert evictions(warned_until_later(RELEASED, mode="observe")) == []


def test_missing_data_never_acts_on_a_release() -> None:
    assert evictions(warned_until_later(RELEASED, signals={})) == []
