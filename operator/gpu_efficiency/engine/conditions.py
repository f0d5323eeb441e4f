"""Kubernetes-style status conditions, shared by the planner and the faults engine."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_efficiency.api.status import Condition
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import PolicyEvent


def find_condition(conditions: Sequence[Condition], type: str) -> Condition | None:
    """The condition of this type, if any."""
    for condition in conditions:
        if condition.type == type:
            return condition
    return None


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    generation: int,
) -> list[Condition]:
    """A copy of ``conditions`` with ``type`` set; other conditions keep their order and values.

    ``lastTransitionTime`` moves only when the status changes (not on a new reason or message), so
    ``kubectl`` shows how long a condition has held, as Kubernetes conventions ask.
    """
    previous = find_condition(conditions, type)
    if previous is not None and previous.status == status and previous.last_transition_time:
        transition = previous.last_transition_time
    else:
        transition = format_rfc3339(now)
    updated = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=transition,
        observed_generation=generation,
    )
    result = [updated if c.type == type else c for c in conditions]
    if previous is None:
        result.append(updated)
    return result


def condition_flipped(conditions: Sequence[Condition], type: str, status: str) -> bool:
    """True when ``type`` is absent or holds another status: the moment to emit an event."""
    previous = find_condition(conditions, type)
    return previous is None or previous.status != status


def flip_condition(
    conditions: Sequence[Condition],
    *,
    type: str,
    status: str,
    reason: str,
    message: str,
    now: float,
    generation: int,
    event: PolicyEvent,
) -> tuple[list[Condition], PolicyEvent | None]:
    """Set ``type`` and return ``event`` with it when the status flips (or the condition is new):
    events mark changes, never every cycle in which a condition holds."""
    flipped = condition_flipped(conditions, type, status)
    updated = set_condition(
        conditions, type=type, status=status, reason=reason, message=message, now=now, generation=generation
    )
    return updated, event if flipped else None
