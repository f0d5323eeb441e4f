"""The operator's templates against the code (no helm needed): the ClusterRole lets `report --policy`
read a policy, the NOTES' dry run names the policy, and the settings the Deployment passes through the
environment are the ones `report` and `explain` read, so a `kubectl exec` into the operator's container
judges with the operator's own Prometheus settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_efficiency.cli import build_parser
from gpu_efficiency.config import OperatorConfig, config_from_args

TEMPLATES = Path(__file__).resolve().parents[3] / "charts" / "gpu-efficiency-operator" / "templates"


def _load_template(name: str) -> list[dict[str, Any]]:
    """The YAML documents of a template: directive lines dropped, inline expressions made placeholders."""
    lines = [
        re.sub(r"\{\{.*?\}\}", "X", line)
        for line in (TEMPLATES / name).read_text().splitlines()
        if not re.fullmatch(r"\s*\{\{-?.*-?\}\}\s*", line)
    ]
    return [doc for doc in yaml.safe_load_all("\n".join(lines)) if doc]


def test_cluster_role_scales_standalone_replicasets_and_only_lists_cronjobs_and_hpas() -> None:
    """A ReplicaSet no Deployment owns is scaled through replicasets/scale and recorded by a patch;
    a CronJob is only read (its Job is suspended); an HPA's target is scaled, the HPA only listed."""
    (role,) = (d for d in _load_template("clusterrole.yaml") if d["kind"] == "ClusterRole")
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    assert verbs[("apps", "replicasets/scale")] == {"get", "patch"}
    assert verbs[("apps", "replicasets")] == {"list", "patch"}
    assert verbs[("batch", "cronjobs")] == {"list"}
    assert verbs[("autoscaling", "horizontalpodautoscalers")] == {"list"}


def test_cluster_role_gets_policies_for_report_and_explain() -> None:
    (role,) = (d for d in _load_template("clusterrole.yaml") if d["kind"] == "ClusterRole")
    verbs = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert verbs[("gpuefficiency.io", "gpuefficiencypolicies")] == {"get", "list", "watch"}
    # delete: only our own DeviceTaintRules (single-GPU quarantine ends by deleting its rule)
    assert {k for k, v in verbs.items() if "delete" in v} == {("resource.k8s.io", "devicetaintrules")}
    # read-only, listed and watched into the DRA cache; claims listed while a rule of ours exists
    assert verbs[("resource.k8s.io", "resourceslices")] == {"list", "watch"}
    assert {"list", "watch"} <= verbs[("resource.k8s.io", "devicetaintrules")]
    assert verbs[("resource.k8s.io", "resourceclaims")] == {"list"}
    assert verbs[("", "pods/eviction")] == {"create"}


def test_notes_dry_run_judges_by_the_admins_policy() -> None:
    notes = (TEMPLATES / "NOTES.txt").read_text()
    reports = [line for line in notes.splitlines() if "gpu-efficiency report" in line]
    assert reports
    assert all("--policy {{ .Values.policy.name }}" in line for line in reports)
    assert "name: {{ .Values.policy.name }}" in notes  # the policy step 2 tells the admin to apply


# Each environment variable the operator container gets, a value for it, and what it sets.
CHART_ENV = {
    "GPUEFF_NAMESPACE": ("ml-ops", "namespace", "ml-ops"),
    "GPUEFF_PROTECTED_NAMESPACES": ("ml-ops,ml-prod", "protected_namespaces", ("ml-ops", "ml-prod")),
    "GPUEFF_PROMETHEUS_URL": ("https://prom.example:9091", "prometheus_url", "https://prom.example:9091"),
    "GPUEFF_PROMETHEUS_TOKEN_FILE": ("/t/token", "prometheus_token_file", "/t/token"),
    "GPUEFF_PROMETHEUS_BASIC_AUTH_FILE": ("/b/auth", "prometheus_basic_auth_file", "/b/auth"),
    "GPUEFF_PROMETHEUS_CA_FILE": ("/c/ca.crt", "prometheus_ca_file", "/c/ca.crt"),
    "GPUEFF_PROMETHEUS_MATCHERS": ('job="dcgm"', "prometheus_matchers", 'job="dcgm"'),
    "GPUEFF_PROMETHEUS_INSECURE": ("1", "prometheus_insecure", True),
    "GPUEFF_PROMETHEUS_CREDENTIALS_FOR": (
        "https://prom.example:9091,http://thanos:9090",
        "prometheus_credentials_for",
        ("https://prom.example:9091", "http://thanos:9090"),
    ),
}


#: Read by `run` only (the operator's own settings, not the connection `report` shares).
RUN_ENV = {"GPUEFF_NOTIFY_SECRET_DIR": ("/n", "notify_secret_dir", "/n")}


def test_the_deployment_passes_connection_settings_through_the_environment() -> None:
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert set(re.findall(r"- name: (GPUEFF_\w+)", text)) == set(CHART_ENV) | set(RUN_ENV)
    args = text[text.index("args:") : text.index("env:")]
    assert "--prometheus-" not in args.replace("--prometheus-refresh-budget", "")
    assert "--protected-namespaces" not in args


@pytest.mark.parametrize("command", ["report", "explain", "run"])
def test_every_command_reads_the_chart_environment(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (value, _, _) in CHART_ENV.items():
        monkeypatch.setenv(name, value)
    extra = ["ns/pod"] if command == "explain" else []
    config = config_from_args(build_parser().parse_args([command, *extra]))
    for name, (_, attr, expected) in CHART_ENV.items():
        assert getattr(config, attr) == expected != getattr(OperatorConfig(), attr), name


def test_run_reads_the_notify_secret_directory_the_chart_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (value, _, _) in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    config = config_from_args(build_parser().parse_args(["run"]))
    for name, (_, attr, expected) in RUN_ENV.items():
        assert getattr(config, attr) == expected != getattr(OperatorConfig(), attr), name
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "mountPath: /etc/gpu-efficiency/notify" in text
    assert "secretName: {{ .Values.notify.secretName }}" in text
