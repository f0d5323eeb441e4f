"""The chart's alert rules (text checks; tests/e2e/test_chart.py renders them with helm and promtool)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "gpu-efficiency-operator"
TEMPLATE = CHART / "templates" / "prometheusrule.yaml"
OPERATIONS = CHART.parents[1] / "docs" / "operations.md"


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


def test_every_alert_links_its_runbook_section_in_operations_md() -> None:
    """runbook_url (kube-prometheus convention) into docs/operations.md, and that section exists."""
    text = TEMPLATE.read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    assert len(alerts) >= 9
    headings = set(re.findall(r"^### (\w+)$", OPERATIONS.read_text(), flags=re.MULTILINE))
    blocks = dict(zip(alerts, re.split(r"- alert: \w+", text)[1:], strict=True))
    for alert in alerts:
        assert f"runbook_url: '{{{{ $runbook }}}}#{alert.lower()}'" in blocks[alert], alert
        assert alert in headings, f"docs/operations.md has no section '### {alert}'"
    assert set(headings) >= set(alerts)
