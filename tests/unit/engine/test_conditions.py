from gpu_efficiency.api.status import Condition
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.conditions import condition_flipped, find_condition, set_condition

T0 = 1_700_000_000.0


def test_new_condition_is_appended_with_now() -> None:
    conditions = set_condition(
        [], type="Ready", status="True", reason="Evaluated", message="ok", now=T0, generation=3
    )
    assert conditions == [
        Condition(
            type="Ready",
            status="True",
            reason="Evaluated",
            message="ok",
            last_transition_time=format_rfc3339(T0),
            observed_generation=3,
        )
    ]


def test_transition_time_kept_while_status_holds_even_if_reason_changes() -> None:
    first = set_condition([], type="Ready", status="True", reason="A", message="a", now=T0, generation=1)
    later = set_condition(
        first, type="Ready", status="True", reason="B", message="b", now=T0 + 600, generation=2
    )
    assert later[0].last_transition_time == format_rfc3339(T0)
    assert (later[0].reason, later[0].message, later[0].observed_generation) == ("B", "b", 2)


def test_transition_time_moves_when_status_changes() -> None:
    first = set_condition([], type="Ready", status="True", reason="A", message="", now=T0, generation=1)
    later = set_condition(
        first, type="Ready", status="False", reason="A", message="", now=T0 + 600, generation=1
    )
    assert later[0].last_transition_time == format_rfc3339(T0 + 600)


def test_other_conditions_untouched_and_order_kept() -> None:
    valid = Condition(type="PolicyValid", status="True", reason="Valid", last_transition_time="x")
    conditions = set_condition(
        [valid], type="Ready", status="True", reason="A", message="", now=T0, generation=1
    )
    conditions = set_condition(
        conditions, type="PolicyValid", status="True", reason="Valid", message="", now=T0 + 5, generation=1
    )
    assert [c.type for c in conditions] == ["PolicyValid", "Ready"]
    assert conditions[0].last_transition_time == "x"


def test_flipped_and_find() -> None:
    conditions = set_condition(
        [], type="MetricsAvailable", status="False", reason="Down", message="", now=T0, generation=1
    )
    assert find_condition(conditions, "MetricsAvailable") is not None
    assert find_condition(conditions, "Ready") is None
    assert not condition_flipped(conditions, "MetricsAvailable", "False")
    assert condition_flipped(conditions, "MetricsAvailable", "True")
    assert condition_flipped([], "MetricsAvailable", "False")
