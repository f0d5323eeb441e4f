"""The chart's alert rules (text checks; tests/e2e/test_chart.py renders them with helm and promtool)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "gpu-efficiency-operator"


def _rule(alert: str) -> str:
    """The template text of one alert, up to the next ``{{- end }}``."""
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    match = re.search(rf"- alert: {alert}\n(.*?)\{{\{{- end }}}}", template, re.S)
    assert match, f"no {alert} in the PrometheusRule template"
    return match.group(1)


def test_no_leader_alert_fires_when_no_replica_leads_or_none_reports() -> None:
    rule = _rule("GPUEfficiencyNoLeader")
    expr = next(line for line in rule.splitlines() if line.strip().startswith("expr:"))
    assert "sum(gpu_efficiency_leader{" in expr
    assert "== 0" in expr
    assert "absent(gpu_efficiency_leader{" in expr
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["prometheusRule"]["alerts"]["noLeader"] == {
        "enabled": True,
        "for": "5m",
        "severity": "warning",
    }


def test_the_reclaim_pending_alert_carries_the_pods_own_namespace() -> None:
    rule = _rule("GPUEfficiencyIdleGPUReclaimPending")
    expr = next(line for line in rule.splitlines() if line.strip().startswith("expr:"))
    assert "max by (namespace, pod, owner, deadline, policy)" in expr
    assert '"namespace", "$1", "exported_namespace", "(.+)"' in expr
    assert '"pod", "$1", "exported_pod", "(.+)"' in expr
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    assert "gpuefficiency.io/keep-for=4h --overwrite" in template
