"""Model-level validation: the checks the CRD's CEL rules mirror, and readable errors."""

import pytest
from pydantic import ValidationError

from gpu_efficiency.api.durations import format_duration, parse_duration
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec, Mode


def test_defaults_are_safe() -> None:
    spec = GPUEfficiencyPolicySpec()
    assert spec.mode is Mode.OBSERVE
    assert spec.eviction.allow_bare_pods is False
    assert spec.idle.allow_opt_out is False
    assert spec.faults.circuit_breaker.max_tainted_fraction == 0.2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"interval": "10m", "window": "5m"}, "window must be at least interval"),
        # clock footguns (first-run review): each once made the operator silently clamp or go blind
        ({"interval": "0s"}, "interval must be at least 1s"),
        ({"interval": "500ms", "window": "1m"}, "interval must be at least 1s"),
        (
            {"interval": "10s", "window": "30s"},
            r"window must be at least 4 x metrics.prometheus.scrapeInterval",
        ),
        (
            {"window": "1m", "metrics": {"prometheus": {"scrapeInterval": "30s"}}},
            r"window must be at least 4 x",
        ),
        ({"metrics": {"prometheus": {"scrapeInterval": "0s"}}}, "scrapeInterval must be longer than 0s"),
        (
            {"metrics": {"prometheus": {"maxStaleness": "10s"}}},
            "maxStaleness must be at least scrapeInterval",
        ),
        ({"metrics": {"prometheus": {"queryTimeout": "0s"}}}, "queryTimeout must be longer than 0s"),
        (
            {"mode": "Enforce", "idle": {"warningPeriod": "0s"}},
            "warningPeriod must be longer than 0s in Enforce",
        ),
        (
            {"underutilization": {"noTensorSmActiveMin": 0.8, "noTensorSmActiveMax": 0.5}},
            "noTensorSmActiveMin",
        ),
        ({"faults": {"xid": {"critical": [79], "ignored": [79]}}}, "both critical and ignored"),
        ({"mode": "Destroy"}, "Observe"),
        ({"interval": "ten seconds"}, "pattern"),
        ({"idle": {"activityBelow": 2}}, "less than or equal to 1"),
        ({"unknownField": 1}, "Extra inputs are not permitted"),
        (
            {
                "selection": {
                    "podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}
                }
            },
            "operator In on key 'a' needs values",
        ),
        (
            {
                "selection": {
                    "nodeSelector": {
                        "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                    }
                }
            },
            "takes no values",
        ),
    ],
)
def test_invalid_specs_are_rejected(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GPUEfficiencyPolicySpec.model_validate(spec)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("1h30m", 5400), ("500ms", 0.5), ("1.5h", 5400)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "1d", "m5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(3725) == "1h2m5s"
    assert format_duration(0) == "0s"


def test_reclaim_actions_default_per_kind_and_reject_actions_that_do_not_fit() -> None:
    from gpu_efficiency.api.policy import ReclaimAction

    actions = GPUEfficiencyPolicySpec().reclaim.actions
    assert actions.for_kind("Deployment") is ReclaimAction.SCALE_TO_ZERO
    assert actions.for_kind("Notebook") is ReclaimAction.STOP
    assert actions.for_kind("DaemonSet") is ReclaimAction.RECOMMEND
    chosen = GPUEfficiencyPolicySpec.model_validate({"reclaim": {"actions": {"Deployment": "Evict"}}})
    assert chosen.reclaim.actions.for_kind("Deployment") is ReclaimAction.EVICT
    with pytest.raises(ValidationError, match="Deployment"):
        GPUEfficiencyPolicySpec.model_validate({"reclaim": {"actions": {"Deployment": "Stop"}}})
    with pytest.raises(ValidationError, match="DaemonSet"):
        GPUEfficiencyPolicySpec.model_validate({"reclaim": {"actions": {"DaemonSet": "Evict"}}})


def test_every_owner_kind_field_is_the_action_for_kind_gives() -> None:
    """``for_kind`` looks a kind's field up in a table made from the fields' aliases: a field added
    without its kind as alias would make that kind Recommend whatever the policy says."""
    from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec, ReclaimAction

    fields = type(GPUEfficiencyPolicySpec().reclaim.actions).model_fields
    recommend_all = {info.alias: "Recommend" for info in fields.values()}
    for chosen in (
        GPUEfficiencyPolicySpec(),
        GPUEfficiencyPolicySpec.model_validate({"reclaim": {"actions": recommend_all}}),
    ):
        actions = chosen.reclaim.actions
        for name, info in fields.items():
            assert info.alias, name
            assert actions.for_kind(info.alias) is getattr(actions, name), info.alias
    defaults = GPUEfficiencyPolicySpec().reclaim.actions
    assert sum(defaults.for_kind(i.alias or "") is not ReclaimAction.RECOMMEND for i in fields.values()) > 10


def test_notify_sinks_need_unique_names_and_known_reasons() -> None:
    import pydantic

    from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec

    sink = {"name": "team", "type": "CloudEvents", "urlSecretKey": "team-url"}
    spec = GPUEfficiencyPolicySpec.model_validate({"notify": [sink]})
    assert spec.notify[0].url_secret_key == "team-url"
    assert spec.notify[0].max_per_minute == 30
    with pytest.raises(pydantic.ValidationError, match="sink names must be unique"):
        GPUEfficiencyPolicySpec.model_validate({"notify": [sink, sink]})
    with pytest.raises(pydantic.ValidationError):
        GPUEfficiencyPolicySpec.model_validate({"notify": [sink | {"reasons": ["PodDeleted"]}]})
    with pytest.raises(pydantic.ValidationError):
        GPUEfficiencyPolicySpec.model_validate({"notify": [sink | {"urlSecretKey": "../../etc/passwd"}]})


def test_the_footgun_limits_still_admit_the_edges() -> None:
    """The limits are exact: a window of exactly 4 scrapes, a 1s interval, and a 0s warning in
    Observe (nothing is reclaimed) or with idle reclamation off are all valid."""
    for spec in (
        {
            "interval": "1s",
            "window": "4s",
            "metrics": {"prometheus": {"scrapeInterval": "1s", "maxStaleness": "1s"}},
        },
        {"window": "1m"},
        {"mode": "Observe", "idle": {"warningPeriod": "0s"}},
        {"mode": "Enforce", "idle": {"enabled": False, "warningPeriod": "0s"}},
    ):
        GPUEfficiencyPolicySpec.model_validate(spec)
