"""`report` and `explain` take the flags that reach Prometheus (as `run` does) and only those, and the
report says what its per-day figures are: a projection, in a named currency."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpu_efficiency import report
from gpu_efficiency.cli import build_parser
from gpu_efficiency.config import OperatorConfig, config_from_args
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.report import build_report, render_table
from tests.unit.engine import builders as b

CONNECTION_FLAGS = {
    "--prometheus-url",
    "--prometheus-token-file",
    "--prometheus-basic-auth-file",
    "--prometheus-ca-file",
    "--prometheus-insecure-skip-verify",
    "--prometheus-matchers",
    "--operator-namespace",
    "--protected-namespaces",
    "--agent-urls",
}
RUN_ONLY_FLAGS = {
    "--prometheus-refresh-budget",
    "--dry-run",
    "--leader-election",
    "--no-leader-election",
    "--lease-name",
    "--lease-seconds",
    "--identity",
    "--metrics-port",
    "--health-port",
    "--status-refresh-seconds",
    "--watch-cache",
    "--no-watch-cache",
    "--log-level",
    "--log-format",
}


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _flags(name: str) -> set[str]:
    return {flag for action in _subparser(name)._actions for flag in action.option_strings}


@pytest.mark.parametrize("command", ["report", "explain"])
def test_report_and_explain_take_the_connection_flags_and_no_run_flag(command: str) -> None:
    flags = _flags(command)
    assert flags >= CONNECTION_FLAGS | {"--policy", "--policy-file", "--output"}
    assert flags & RUN_ONLY_FLAGS == set()
    assert _flags("run") >= CONNECTION_FLAGS | RUN_ONLY_FLAGS


def test_report_reaches_prometheus_as_run_does() -> None:
    argv = [
        "--prometheus-url=https://prom.example:9091",
        "--prometheus-token-file=/t/token",
        "--prometheus-basic-auth-file=/b/auth",
        "--prometheus-ca-file=/c/ca.crt",
        "--prometheus-insecure-skip-verify",
        '--prometheus-matchers=job="dcgm"',
        "--protected-namespaces=ml-prod",
    ]
    report = config_from_args(build_parser().parse_args(["report", *argv]))
    run = config_from_args(build_parser().parse_args(["run", *argv]))
    for name in (
        "prometheus_url",
        "prometheus_token_file",
        "prometheus_basic_auth_file",
        "prometheus_ca_file",
        "prometheus_insecure",
        "prometheus_matchers",
        "protected_namespaces",
    ):
        assert getattr(report, name) == getattr(run, name) != getattr(OperatorConfig(), name), name
    # run's own settings keep their defaults in the report's configuration
    assert (report.dry_run, report.lease_name, report.prometheus_refresh_budget) == (
        False,
        "gpu-efficiency-operator",
        0,
    )


def _idle_report(currency: str) -> dict[str, object]:
    snap = b.snapshot(
        [b.gpu("GPU-0", b.idle(), ("team-a", "notebook"))],
        [b.pod("notebook")],
        b.policy(price_per_gpu_hour={"default": 2.5}),
    )
    return build_report(snap, plan_cycle(snap), currency=currency)


def test_report_names_the_currency_and_calls_per_day_figures_a_projection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUEFF_CURRENCY", raising=False)
    assert config_from_args(build_parser().parse_args(["report"])).currency == "USD"
    monkeypatch.setenv("GPUEFF_CURRENCY", "EUR")
    assert config_from_args(build_parser().parse_args(["report"])).currency == "EUR"

    report = _idle_report("EUR")
    assert report["currency"] == "EUR"
    assert "24 h" in str(report["perDayProjection"])
    (row,) = report["namespaces"]  # type: ignore[misc]
    assert (row["idleGpus"], row["idleGpuHoursPerDay"], row["estimatedWastePerDay"]) == (1, 24.0, 60.0)
    table = render_table(report)
    header = table.splitlines()[2]
    assert "IDLE GPU-H/DAY*" in header
    assert "WASTE/DAY* (EUR)" in header
    assert "* projected: the GPUs idle now, held idle for 24 h" in table


class _Policies:
    """CustomObjectsApi as far as load_policy reads it: one policy with a spec and a status."""

    def __init__(self, _api_client: object) -> None:
        pass

    def get_cluster_custom_object(self, *_: str) -> dict[str, object]:
        return {
            "spec": {"mode": "Enforce"},
            "status": {"recentEvictions": ["2026-01-01T00:00:00Z"] * 3, "unknownField": 1},
        }


def test_a_policy_from_the_cluster_brings_its_status_and_the_hours_budget_spent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(report.client, "CustomObjectsApi", _Policies)
    name, spec, status = report.load_policy(build_parser().parse_args(["report", "--policy", "p"]), None)
    assert (name, spec.mode.value, status.recent_evictions) == ("p", "Enforce", ["2026-01-01T00:00:00Z"] * 3)
    # a file or the defaults: no history, nothing spent
    path = tmp_path / "policy.yaml"
    path.write_text("metadata: {name: f}\nspec: {mode: Enforce}\n")
    for argv in (["report", "--policy-file", str(path)], ["report"]):
        *_, status = report.load_policy(build_parser().parse_args(argv), None)
        assert status.recent_evictions == []
