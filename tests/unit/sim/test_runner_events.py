"""Only this run's events count: node and policy names repeat across runs of a scenario, and their
events (namespace ``default``) outlive the objects, so an earlier run's NodeTainted would pass this
run's expectation and its GPUFaultDetected would fail an ``absent`` one."""

from __future__ import annotations

from typing import Any

from gpu_efficiency_sim.runner import events_since

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def _event(reason: str, created: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": reason}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "reason": reason, "involvedObject": {"kind": "Node", "name": "n1"}}


def test_events_before_the_run_are_dropped() -> None:
    events = [
        _event("OldTainted", "2023-11-14T22:13:19Z"),
        _event("SameSecond", "2023-11-14T22:13:20Z"),
        _event("NewTainted", "2023-11-14T22:14:00Z"),
        _event("NoTimestamp", None),
    ]
    kept = [e["reason"] for e in events_since(events, T0)]
    assert kept == ["SameSecond", "NewTainted", "NoTimestamp"]


def test_without_a_start_time_every_event_is_kept() -> None:
    events = [_event("Old", "2020-01-01T00:00:00Z")]
    assert events_since(events, None) == events
