"""A hung cycle fails the liveness probe; completed and failed cycles show in the metrics."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from tests.unit.runtime.test_scheduler import Clock, body

from gpu_efficiency import metrics
from gpu_efficiency.runtime.kopf_wiring import scheduler_alive
from gpu_efficiency.runtime.leader import AlwaysLeader
from gpu_efficiency.runtime.scheduler import PolicyRegistry, Scheduler


class HangingRunner:
    """A cycle that lasts ``seconds`` of the fake clock and asks the probe midway."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds
        self.scheduler: Scheduler | None = None
        self.seen_midway: str | None = None
        self.fail = False
        self.leader = AlwaysLeader()

    def run(self, **_: Any) -> Any:
        self.clock.now += self.seconds
        assert self.scheduler is not None
        self.seen_midway = self.scheduler.stalled()
        if self.fail:
            raise RuntimeError("API server gone")
        return SimpleNamespace(ran=True, status=None, plan=None, seconds=0, writes=0, queries=0, api_reads=0)

    def forget(self, name: str) -> None:
        pass


def _scheduler(seconds: float) -> tuple[Scheduler, PolicyRegistry, HangingRunner, Clock]:
    clock = Clock()
    registry = PolicyRegistry()
    runner = HangingRunner(clock, seconds)
    sched = Scheduler(runner, registry, clock=clock)  # type: ignore[arg-type]
    runner.scheduler = sched
    return sched, registry, runner, clock


def test_a_cycle_hung_past_three_intervals_fails_the_probe() -> None:
    sched, registry, runner, _ = _scheduler(seconds=3 * 60 + 61)
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z", spec={"interval": "60s"}))
    sched.run_due()
    assert runner.seen_midway is not None
    assert "no policy cycle completed for 241s (limit 240s" in runner.seen_midway
    with pytest.raises(kopf.PermanentError, match="no policy cycle completed"):
        scheduler_alive(memo=SimpleNamespace(scheduler=SimpleNamespace(stalled=lambda: runner.seen_midway)))
    assert sched.stalled() is None  # the pass ended: alive again


def test_a_slow_cycle_within_the_limit_and_no_policies_are_alive() -> None:
    sched, registry, runner, clock = _scheduler(seconds=3 * 60 + 59)
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z", spec={"interval": "60s"}))
    sched.run_due()
    assert runner.seen_midway is None
    empty, _, _, clock = _scheduler(seconds=0)
    clock.now += 10_000
    empty.run_due()  # no policy: the pass still completes
    assert empty.stalled() is None
    assert scheduler_alive(memo=SimpleNamespace(scheduler=empty)) == "ok"
    assert scheduler_alive(memo=SimpleNamespace()) == "ok"  # before start-up made the scheduler


def test_a_scheduler_thread_that_never_returns_is_seen() -> None:
    sched, registry, _, clock = _scheduler(seconds=0)
    registry.observe("ADDED", body("p", "2026-01-01T00:00:00Z", spec={"interval": "600s"}))
    sched.run_due()
    clock.now += 3 * 600 + 61  # nothing ran run_due since (the thread is stuck or gone)
    assert sched.stalled() is not None


def _value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def test_last_completed_cycle_and_failures_are_exported() -> None:
    sched, registry, runner, _ = _scheduler(seconds=1)
    registry.observe("ADDED", body("metrics-p", "2026-01-01T00:00:00Z"))
    sched.run_due()
    stamp = _value("gpu_efficiency_last_cycle_timestamp_seconds", policy="metrics-p")
    assert stamp is not None
    assert stamp > 1.7e9
    assert _value("gpu_efficiency_policies") == 1
    errors = _value("gpu_efficiency_cycles_total", policy="metrics-p", result="error") or 0.0
    runner.fail = True
    registry.observe("MODIFIED", body("metrics-p", "2026-01-01T00:00:00Z", generation=2))
    sched.run_due()
    assert _value("gpu_efficiency_cycles_total", policy="metrics-p", result="error") == errors + 1
    assert _value("gpu_efficiency_last_cycle_timestamp_seconds", policy="metrics-p") == stamp
    registry.observe("DELETED", body("metrics-p", "2026-01-01T00:00:00Z", generation=2))
    sched.run_due()
    assert _value("gpu_efficiency_last_cycle_timestamp_seconds", policy="metrics-p") is None
    assert _value("gpu_efficiency_policies") == 0
