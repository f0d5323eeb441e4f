"""What a click may grant, from the policy alone (pure): the Keep for choices and their bound.

The page offers only these choices and the click handler re-checks every value against them, so a
forged form field can never keep a GPU longer than the policy's ``maxKeep`` (which the engine
enforces too, from when it first sees the annotation).
"""

from __future__ import annotations

from gpu_efficiency.api.durations import format_duration, parse_duration

#: Candidate durations offered, shortest first; those over maxKeep are dropped and maxKeep added.
KEEP_STEPS_S = (3600.0, 2 * 3600.0, 4 * 3600.0, 8 * 3600.0, 24 * 3600.0)


def keep_choices(allow_keep_until: bool, max_keep_s: float) -> tuple[str, ...]:
    """The Keep for durations the policy allows ("1h", "2h", ...), none where it allows no keep."""
    if not allow_keep_until or max_keep_s <= 0:
        return ()
    steps = [s for s in KEEP_STEPS_S if s <= max_keep_s]
    if not steps or steps[-1] < max_keep_s:
        steps.append(max_keep_s)
    return tuple(format_duration(s) for s in steps)


def keep_refusal(duration: str, allow_keep_until: bool, max_keep_s: float) -> str:
    """Why a Keep for ``duration`` is refused ('' when the policy allows it)."""
    if not allow_keep_until:
        return "this policy does not allow keeping a GPU (spec.idle.allowKeepUntil is false)"
    try:
        seconds = parse_duration(duration)
    except ValueError:
        return f"{duration!r} is not a duration"
    if duration not in keep_choices(allow_keep_until, max_keep_s) or seconds > max_keep_s:
        return (
            f"keeping for {duration} is not offered: the policy allows at most {format_duration(max_keep_s)}"
        )
    return ""
