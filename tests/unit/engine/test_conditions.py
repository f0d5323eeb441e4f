from gpu_efficiency.api.status import Condition
from gpu_efficiency.engine.conditions import condition_flipped, find_condition, set_condition
from gpu_efficiency.engine.timefmt import format_rfc3339

T0 = 1_700_000_000.0


def test_new_condition_is_appended_with_now() -> None:
    conditions = set_condition([], "Ready", "True", "Evaluated", "ok", T0, 3)
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
    first = set_condition([], "Ready", "True", "A", "a", T0, 1)
    later = set_condition(first, "Ready", "True", "B", "b", T0 + 600, 2)
    assert later[0].last_transition_time == format_rfc3339(T0)
    assert (later[0].reason, later[0].message, later[0].observed_generation) == ("B", "b", 2)


def test_transition_time_moves_when_status_changes() -> None:
    first = set_condition([], "Ready", "True", "A", "", T0, 1)
    later = set_condition(first, "Ready", "False", "A", "", T0 + 600, 1)
    assert later[0].last_transition_time == format_rfc3339(T0 + 600)


def test_other_conditions_untouched_and_order_kept() -> None:
    valid = Condition(type="PolicyValid", status="True", reason="Valid", last_transition_time="x")
    conditions = set_condition([valid], "Ready", "True", "A", "", T0, 1)
    conditions = set_condition(conditions, "PolicyValid", "True", "Valid", "", T0 + 5, 1)
    assert [c.type for c in conditions] == ["PolicyValid", "Ready"]
    assert conditions[0].last_transition_time == "x"


def test_flipped_and_find() -> None:
    conditions = set_condition([], "MetricsAvailable", "False", "Down", "", T0, 1)
    assert find_condition(conditions, "MetricsAvailable") is not None
    assert find_condition(conditions, "Ready") is None
    assert not condition_flipped(conditions, "MetricsAvailable", "False")
    assert condition_flipped(conditions, "MetricsAvailable", "True")
    assert condition_flipped([], "MetricsAvailable", "False")
