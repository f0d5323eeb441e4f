"""Keep for never offers or grants more than the policy's maxKeep, nor anything where keeps are off."""

from __future__ import annotations

import pytest

from gpu_efficiency.selfservice.rules import keep_choices, keep_refusal


@pytest.mark.parametrize(
    ("max_keep_s", "expected"),
    [
        (24 * 3600, ("1h", "2h", "4h", "8h", "24h")),
        (3 * 3600, ("1h", "2h", "3h")),
        (1800, ("30m",)),
        (2 * 3600, ("1h", "2h")),
    ],
)
def test_choices_stop_at_max_keep(max_keep_s: float, expected: tuple[str, ...]) -> None:
    assert keep_choices(True, max_keep_s) == expected


def test_no_choices_where_the_policy_allows_no_keep() -> None:
    assert keep_choices(False, 24 * 3600) == ()


@pytest.mark.parametrize("duration", ["25h", "48h", "3h", "1h30m", "0s", "-1h", "soon", ""])
def test_a_forged_duration_is_refused(duration: str) -> None:
    assert keep_refusal(duration, True, 24 * 3600)


def test_offered_durations_are_granted_and_nothing_where_keeps_are_off() -> None:
    assert keep_refusal("2h", True, 24 * 3600) == ""
    assert "allowKeepUntil" in keep_refusal("2h", False, 24 * 3600)
    assert "at most 1h" in keep_refusal("2h", True, 3600)
