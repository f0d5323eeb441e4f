"""The operator's templates against the code (no helm needed): the ClusterRole lets `report --policy`
read a policy, the NOTES' dry run names the policy, and the settings the Deployment passes through the
environment are the ones `report` and `explain` read, so a `kubectl exec` into the operator's container
judges with the operator's own Prometheus settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpu_efficiency.cli import build_parser
from gpu_efficiency.config import OperatorConfig, config_from_args
from gpu_efficiency.http_headers import RESERVED

TEMPLATES = Path(__file__).resolve().parents[3] / "charts" / "gpu-efficiency-operator" / "templates"


def _cluster_role_rules(enforce: bool) -> dict[tuple[str, str], set[str]]:
    """The ClusterRole's grants under rbac.mode observe or enforce: the enforce part is the block
    inside `{{- if $enforce }}` (the template's only conditional rule block)."""
    text = (TEMPLATES / "clusterrole.yaml").read_text()
    head, sep, tail = text.partition("{{- if $enforce }}")
    assert sep, "the ClusterRole has an enforce-only part"
    enforce_part, sep, rest = tail.partition("{{- end }}")
    assert sep
    chosen = head + (enforce_part if enforce else "") + rest
    lines = [
        re.sub(r"\{\{.*?\}\}", "X", line)
        for line in chosen.splitlines()
        if not re.fullmatch(r"\s*\{\{-?.*-?\}\}\s*", line)
    ]
    (role,) = (d for d in yaml.safe_load_all("\n".join(lines)) if d and d["kind"] == "ClusterRole")
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


WRITES = {"create", "patch", "update", "delete", "deletecollection"}
#: What only Enforce does: evict, reclaim owners (/scale, suspend, stop) and quarantine on DRA.
ENFORCE_ONLY = {
    ("", "pods/eviction"): {"create"},
    ("resource.k8s.io", "devicetaintrules"): {"create", "patch", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"list"},
    ("apps", "deployments/scale"): {"get", "patch"},
    ("apps", "statefulsets/scale"): {"get", "patch"},
    ("apps", "replicasets/scale"): {"get", "patch"},
    ("apps", "replicasets"): {"patch"},
    ("apps", "deployments"): {"patch"},
    ("apps", "statefulsets"): {"patch"},
    ("batch", "jobs"): {"patch"},
    ("jobset.x-k8s.io", "jobsets"): {"patch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"patch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets/scale"): {"get", "patch"},
    ("kubeflow.org", "notebooks"): {"patch"},
    ("ray.io", "rayclusters"): {"patch"},
    ("ray.io", "rayjobs"): {"patch"},
    ("kubeflow.org", "pytorchjobs"): {"patch"},
    ("kubeflow.org", "mpijobs"): {"patch"},
    ("kubeflow.org", "tfjobs"): {"patch"},
    ("trainer.kubeflow.org", "trainjobs"): {"patch"},
    ("kueue.x-k8s.io", "workloads"): {"patch"},
}


def test_cluster_role_scales_standalone_replicasets_and_only_reads_cronjobs_and_hpas() -> None:
    """A ReplicaSet no Deployment owns is scaled through replicasets/scale and recorded by a patch;
    a CronJob is only read (its Job is suspended); an HPA's target is scaled, the HPA only read (listed and watched)."""
    assert ("apps", "replicasets/scale") not in _cluster_role_rules(enforce=False)
    verbs = _cluster_role_rules(enforce=True)
    assert verbs[("apps", "replicasets/scale")] == {"get", "patch"}
    assert verbs[("apps", "replicasets")] == {"list", "watch", "patch"}
    assert verbs[("batch", "cronjobs")] == {"list", "watch"}
    assert verbs[("autoscaling", "horizontalpodautoscalers")] == {"list", "watch"}


def test_cluster_role_gets_policies_for_report_and_explain() -> None:
    for enforce in (False, True):
        verbs = _cluster_role_rules(enforce)
        assert verbs[("gpuefficiency.io", "gpuefficiencypolicies")] == {"get", "list", "watch"}
        assert verbs[("resource.k8s.io", "resourceslices")] == {"list", "watch"}
        assert {"list", "watch"} <= verbs[("resource.k8s.io", "devicetaintrules")]


def test_observe_mode_writes_only_annotations_conditions_events_and_status() -> None:
    """rbac.mode=observe (the default): what spec.mode: Observe writes and nothing else; no delete,
    no eviction, no workload write."""
    observe = _cluster_role_rules(enforce=False)
    writes = {k: v & WRITES for k, v in observe.items() if v & WRITES}
    assert writes == {
        ("", "pods"): {"patch"},  # gpuefficiency.io/ annotations (the admission policy narrows it)
        ("", "nodes"): {"patch"},  # fault annotations
        ("", "nodes/status"): {"patch"},  # the GPUHealthy condition
        ("", "events"): {"create"},
        ("gpuefficiency.io", "gpuefficiencypolicies/status"): {"patch"},
    }
    for key, verbs in ENFORCE_ONLY.items():
        assert not (verbs & WRITES) & observe.get(key, set()), key
    assert ("", "pods/eviction") not in observe


def test_enforce_mode_adds_exactly_the_reclaim_and_quarantine_writes() -> None:
    observe, enforce = _cluster_role_rules(enforce=False), _cluster_role_rules(enforce=True)
    added = {k: enforce[k] - observe.get(k, set()) for k in enforce if enforce[k] - observe.get(k, set())}
    assert added == ENFORCE_ONLY
    # delete: only our own DeviceTaintRules (single-GPU quarantine ends by deleting its rule)
    assert {k for k, v in enforce.items() if "delete" in v} == {("resource.k8s.io", "devicetaintrules")}


def test_rbac_mode_defaults_to_observe_and_is_documented() -> None:
    values = yaml.safe_load((TEMPLATES.parent / "values.yaml").read_text())
    assert values["rbac"]["mode"] == "observe"
    schema = json.loads((TEMPLATES.parent / "values.schema.json").read_text())
    assert schema["properties"]["rbac"]["properties"]["mode"]["enum"] == ["observe", "enforce"]
    assert "no deletes" not in (TEMPLATES / "clusterrole.yaml").read_text().lower()


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
    "GPUEFF_PROMETHEUS_HEADERS": (
        "THANOS-TENANT: gpu-team,X-Scope-OrgID: gpu-team",
        "prometheus_headers",
        ("THANOS-TENANT: gpu-team", "X-Scope-OrgID: gpu-team"),
    ),
    "GPUEFF_PROMETHEUS_CREDENTIALS_FOR": (
        "https://prom.example:9091,http://thanos:9090",
        "prometheus_credentials_for",
        ("https://prom.example:9091", "http://thanos:9090"),
    ),
}


#: Read by `run` only (the operator's own settings, not the connection `report` shares).
RUN_ENV = {
    "GPUEFF_NOTIFY_SECRET_DIR": ("/n", "notify_secret_dir", "/n"),
    "GPUEFF_SLACK_SIGNING_SECRET_FILE": (
        "/s/signing-secret",
        "slack_signing_secret_file",
        "/s/signing-secret",
    ),
    "GPUEFF_SLACK_RESPONSE_URLS": (
        "https://hooks.slack-gov.com/",
        "slack_response_urls",
        "https://hooks.slack-gov.com/",
    ),
    "GPUEFF_SELFSERVICE_PORT": ("8082", "selfservice_port", 8082),
    "GPUEFF_SELFSERVICE_URL": ("https://gpu.example.com", "selfservice_url", "https://gpu.example.com"),
    "GPUEFF_SELFSERVICE_KEY_FILE": (
        "/etc/gpu-efficiency/selfservice/key2",
        "selfservice_key_file",
        "/etc/gpu-efficiency/selfservice/key2",
    ),
}


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


def test_the_chart_refuses_the_headers_the_operator_refuses() -> None:
    """helm cannot call the operator's parser: the template keeps its own copy of RESERVED."""
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    match = re.search(r'\$reserved := list ((?:"[a-z-]+" ?)+)', helpers)
    assert match
    assert set(re.findall(r'"([a-z-]+)"', match.group(1))) == RESERVED


def test_run_reads_the_notify_secret_directory_the_chart_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (value, _, _) in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    config = config_from_args(build_parser().parse_args(["run"]))
    for name, (_, attr, expected) in RUN_ENV.items():
        assert getattr(config, attr) == expected != getattr(OperatorConfig(), attr), name
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "mountPath: /etc/gpu-efficiency/notify" in text
    assert "secretName: {{ .Values.notify.secretName }}" in text


def _workload_resources() -> dict[str, list[str]]:
    """gpueff.workloadResources: the kinds the "-workloads" admission policy covers."""
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    match = re.search(r'define "gpueff.workloadResources" -\}\}\n(.*?)\{\{- end', helpers, re.S)
    assert match
    loaded: dict[str, list[str]] = yaml.safe_load(match.group(1))
    return loaded


def test_the_workloads_admission_policy_covers_every_workload_the_operator_may_patch() -> None:
    """A workload kind whose patch the ClusterRole grants must be narrowed by the admission policy
    (only /scale, suspend, the stop annotation and ours): add a new owner kind to both."""
    covered = {(group, r) for group, resources in _workload_resources().items() for r in resources}
    patched = {
        (group, resource)
        for (group, resource), verbs in _cluster_role_rules(enforce=True).items()
        if "patch" in verbs and group not in ("", "gpuefficiency.io", "resource.k8s.io")
    }
    assert {(g, r.removesuffix("/scale")) for g, r in patched} <= covered
    policy = (TEMPLATES / "admission-policy.yaml").read_text()
    assert 'include "gpueff.workloadResources"' in policy
    assert '"%s/scale"' in policy  # each kind's /scale too
