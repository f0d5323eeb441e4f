"""Condition flipped → event + set, in one helper: the event goes out on the flip only."""

from __future__ import annotations

from gpu_efficiency.engine.conditions import flip_condition
from gpu_efficiency.engine.model import PolicyEvent

EVENT = PolicyEvent(reason="Broken", message="it broke", type="Warning")


def test_the_event_goes_out_when_the_condition_appears_or_flips_only() -> None:
    kw = {"type": "Healthy", "reason": "R", "message": "m", "generation": 1, "event": EVENT}
    conditions, event = flip_condition([], status="False", now=10.0, **kw)  # type: ignore[arg-type]
    assert event == EVENT
    assert conditions[0].status == "False"
    again, event = flip_condition(conditions, status="False", now=20.0, **kw)  # type: ignore[arg-type]
    assert event is None
    assert again[0].last_transition_time == conditions[0].last_transition_time
    healed, event = flip_condition(again, status="True", now=30.0, **kw)  # type: ignore[arg-type]
    assert event == EVENT
    assert healed[0].status == "True"
