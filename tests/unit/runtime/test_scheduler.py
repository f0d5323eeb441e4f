"""The scheduler: due policies run, edits run at once, deletions stop, seniors are passed in order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_efficiency.runtime.leader import AlwaysLeader
from gpu_efficiency.runtime.scheduler import PolicyRegistry, Scheduler


@dataclass
class FakeRunner:
    """Records run() calls; the real CycleRunner needs a cluster."""

    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    leader: AlwaysLeader = field(default_factory=AlwaysLeader)

    def run(self, *, name: str, seniors: tuple[Any, ...], **_: Any) -> Any:
        self.calls.append((name, tuple(s.name for s in seniors)))

        class Report:
            ran = False
            status = None

        return Report()

    def forget(self, name: str) -> None:
        self.forgotten.append(name)


def body(
    name: str, created: str, generation: int = 1, spec: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "generation": generation,
        },
        "spec": dict(spec or {"interval": "10s", "window": "60s"}),
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CLOCK = Clock()


def scheduler() -> tuple[Scheduler, PolicyRegistry, FakeRunner]:
    registry, runner = PolicyRegistry(), FakeRunner()
    return Scheduler(runner, registry, clock=CLOCK), registry, runner  # type: ignore[arg-type]


def test_runs_in_precedence_order_with_seniors() -> None:
    sched, registry, runner = scheduler()
    registry.observe("ADDED", body("young", "2026-01-02T00:00:00Z"))
    registry.observe("ADDED", body("old", "2026-01-01T00:00:00Z"))
    registry.observe("ADDED", body("broken", "2026-01-01T12:00:00Z", spec={"mode": "Destroy"}))
    assert sched.run_due() == ["old", "broken", "young"]
    # An invalid policy claims nothing, so it is not a senior of anyone.
    assert runner.calls == [("old", ()), ("broken", ("old",)), ("young", ("old",))]


def test_interval_edits_and_deletion() -> None:
    sched, registry, runner = scheduler()
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z"))
    assert sched.run_due() == ["p"]
    CLOCK.now += 9
    assert sched.run_due() == []  # not due before its 10s interval
    CLOCK.now += 1
    assert sched.run_due() == ["p"]
    registry.observe("MODIFIED", body("p", "2026-01-01T00:00:00Z", generation=2))
    assert sched.run_due() == ["p"]  # a spec edit is evaluated at once
    registry.observe("DELETED", body("p", "2026-01-01T00:00:00Z", generation=2))
    CLOCK.now += 100
    assert sched.run_due() == []
    assert runner.forgotten == ["p"]


def test_a_deleting_policy_stops_at_once() -> None:
    sched, registry, _ = scheduler()
    deleting = body("p", "2026-01-01T00:00:00Z")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    registry.observe("MODIFIED", deleting)
    assert sched.run_due() == []


class SlowRunner(FakeRunner):
    """A cycle that takes ``seconds`` of the fake clock."""

    seconds: float = 3.0

    def run(self, *, name: str, seniors: tuple[Any, ...], **kw: Any) -> Any:
        CLOCK.now += self.seconds
        return super().run(name=name, seniors=seniors, **kw)


def test_cycles_are_paced_from_their_start_not_their_end() -> None:
    registry, runner = PolicyRegistry(), SlowRunner()
    sched = Scheduler(runner, registry, clock=CLOCK)  # type: ignore[arg-type]
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z"))
    first = CLOCK.now
    assert sched.run_due() == ["p"]  # ends 3s later
    CLOCK.now = first + 9.9
    assert sched.run_due() == []
    CLOCK.now = first + 10.0  # the period is the 10s interval, not 10s + the cycle's 3s
    assert sched.run_due() == ["p"]


def test_an_overrunning_cycle_skips_the_slots_it_missed() -> None:
    registry, runner = PolicyRegistry(), SlowRunner()
    runner.seconds = 25.0
    sched = Scheduler(runner, registry, clock=CLOCK)  # type: ignore[arg-type]
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z"))
    first = CLOCK.now
    assert sched.run_due() == ["p"]  # runs until first + 25: the slots at +10 and +20 are gone
    assert sched.run_due() == []  # not back to back
    CLOCK.now = first + 29.9
    assert sched.run_due() == []
    CLOCK.now = first + 30.0
    assert sched.run_due() == ["p"]


def test_next_start_stays_on_the_grid() -> None:
    from gpu_efficiency.runtime.scheduler import next_start

    assert next_start(100.0, 101.0, 10.0) == 110.0
    assert next_start(100.0, 110.0, 10.0) == 120.0  # ended exactly on a slot: that slot is gone
    assert next_start(100.0, 135.5, 10.0) == 140.0
