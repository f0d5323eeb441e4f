"""A spec's durations are parsed once, when the spec is validated: the admin's string stays what the
API serves back, and the engine reads its seconds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_efficiency.api.durations import Duration, parse_duration
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec


def test_a_spec_duration_keeps_its_string_and_knows_its_seconds() -> None:
    spec = GPUEfficiencyPolicySpec.model_validate({"window": "1h30m", "idle": {"idleFor": "90s"}})
    assert spec.window == "1h30m"
    assert spec.window.seconds == 5400.0
    assert spec.idle.idle_for.seconds == 90.0
    wire = spec.model_dump(by_alias=True, mode="json")
    assert wire["window"] == "1h30m"
    assert type(wire["window"]) is str
    assert GPUEfficiencyPolicySpec.model_validate(wire) == spec


def test_defaults_are_durations_too() -> None:
    spec = GPUEfficiencyPolicySpec()
    assert spec.window.seconds == parse_duration("10m")
    assert spec.faults.drain_timeout.seconds == parse_duration(str(spec.faults.drain_timeout))


@pytest.mark.parametrize("text", ["", "10", "1x", "m5", "-5m"])
def test_a_malformed_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Duration(text)
    with pytest.raises(ValidationError):
        GPUEfficiencyPolicySpec.model_validate({"window": text})
