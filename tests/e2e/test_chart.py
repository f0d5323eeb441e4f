"""The Helm chart against the real tools: helm lint/template (helm built from hack/localcluster/helm),
promtool on the alert rules, server-side dry run and `helm install` on the local cluster, and
`kubectl auth can-i` as the chart's ServiceAccounts (least privilege, positive and negative).

Rendering tests need only the helm binary; the rest use the session `cluster` fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpu_efficiency.http_headers import parse_headers
from tests.e2e.harness import CHART, Cluster, built_tool, create_namespace, delete_namespace, wait_for

pytestmark = pytest.mark.e2e

MONITORING_APIS = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")
OPERATOR_METRICS = (
    "gpu_efficiency_idle_gpus",
    "gpu_efficiency_estimated_waste_per_hour",
    "gpu_efficiency_diagnoses",
    "gpu_efficiency_tainted_nodes",
    "gpu_efficiency_evictions_total",
    "gpu_efficiency_pods",
    "gpu_efficiency_metrics_available",
    "gpu_efficiency_circuit_breaker_open",
    "gpu_efficiency_cycles_total",
    "gpu_efficiency_cycle_duration_seconds_bucket",
    "gpu_efficiency_idle_gpu_hours_total",
)
#: The operator's ClusterRole under rbac.mode=observe (the default), exactly: a change here is a
#: privilege change and must be deliberate. Reads, annotations, conditions, events and status only.
EXPECTED_OBSERVE_RULES = {
    ("", "pods"): {"get", "list", "watch", "patch"},
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("", "nodes/status"): {"patch"},
    ("", "namespaces"): {"list", "watch"},
    ("", "events"): {"create"},
    ("resource.k8s.io", "resourceslices"): {"list", "watch"},
    ("resource.k8s.io", "devicetaintrules"): {"list", "watch"},
    ("gpuefficiency.io", "gpuefficiencypolicies"): {"get", "list", "watch"},  # get: report --policy
    ("gpuefficiency.io", "gpuefficiencypolicies/status"): {"patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("apps", "replicasets"): {"list", "watch"},
    ("apps", "deployments"): {"list", "watch"},
    ("apps", "statefulsets"): {"list", "watch"},
    ("batch", "cronjobs"): {"list", "watch"},
    ("autoscaling", "horizontalpodautoscalers"): {"list", "watch"},
    ("policy", "poddisruptionbudgets"): {"list", "watch"},
    ("batch", "jobs"): {"list", "watch"},
    ("jobset.x-k8s.io", "jobsets"): {"list"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"list"},
    ("kubeflow.org", "notebooks"): {"list"},
    ("serving.kserve.io", "inferenceservices"): {"list"},
    ("ray.io", "rayclusters"): {"list"},
    ("ray.io", "rayjobs"): {"list"},
    ("kubeflow.org", "pytorchjobs"): {"list"},
    ("kubeflow.org", "mpijobs"): {"list"},
    ("kubeflow.org", "tfjobs"): {"list"},
    ("trainer.kubeflow.org", "trainjobs"): {"list"},
    ("kueue.x-k8s.io", "workloads"): {"list"},
}
#: What rbac.mode=enforce adds: evictions, owner reclaims and quarantine.
ENFORCE_ADDS = {
    ("", "pods/eviction"): {"create"},
    ("resource.k8s.io", "devicetaintrules"): {"create", "patch", "delete"},
    # who holds a faulty device, for the drain before a NoExecute device taint
    ("resource.k8s.io", "resourceclaims"): {"list"},
    ("apps", "deployments"): {"patch"},
    ("apps", "statefulsets"): {"patch"},
    ("apps", "deployments/scale"): {"get", "patch"},
    ("apps", "statefulsets/scale"): {"get", "patch"},
    ("apps", "replicasets"): {"patch"},
    ("apps", "replicasets/scale"): {"get", "patch"},
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
EXPECTED_ENFORCE_RULES = {
    key: EXPECTED_OBSERVE_RULES.get(key, set()) | ENFORCE_ADDS.get(key, set())
    for key in EXPECTED_OBSERVE_RULES.keys() | ENFORCE_ADDS.keys()
}
PART_OF_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)
ALL_ON = (
    "agent.enabled=true",
    "agent.writeNodeCondition=true",
    "metrics.serviceMonitor.enabled=true",
    "agent.serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "policy.create=true",
)


# --- tools -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_bin() -> str:
    return built_tool("helm", "HELM")


def run(
    *args: str, expect_failure: bool = False, input_: str | None = None, kubeconfig: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a tool; assert it succeeded (or, with expect_failure, that it failed)."""
    env = {**os.environ, **({"KUBECONFIG": kubeconfig} if kubeconfig else {})}
    proc = subprocess.run(args, capture_output=True, text=True, input=input_, env=env, timeout=300)
    if expect_failure:
        assert proc.returncode != 0, (
            f"`{' '.join(args)}` succeeded but should have failed:\n{proc.stdout[:2000]}"
        )
    else:
        assert proc.returncode == 0, (
            f"`{' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


def render(
    helm: str,
    *sets: str,
    namespace: str = "gpu-eff",
    release: str = "gpueff",
    api_versions: bool = False,
    apis: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    tmp: Path | None = None,
) -> list[dict[str, Any]]:
    args = [helm, "template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    for api in (*(MONITORING_APIS if api_versions else ()), *apis):
        args += ["--api-versions", api]
    if values is not None:
        assert tmp is not None
        path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    return [d for d in yaml.safe_load_all(run(*args).stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


# --- lint and render ---------------------------------------------------------------------------


def test_helm_lint_strict(helm_bin: str) -> None:
    for sets in ((), ALL_ON):
        args = [helm_bin, "lint", "--strict", str(CHART)]
        for s in sets:
            args += ["--set", s]
        out = run(*args).stdout
        assert "0 chart(s) failed" in out, out


def test_default_render_is_the_minimal_operator(helm_bin: str) -> None:
    docs = render(helm_bin)
    assert kinds(docs) == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
        ]
    )
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert all(k in labels for k in PART_OF_LABELS), (doc["kind"], labels)
    # Monitoring objects need the Prometheus Operator's APIs even when enabled.
    assert "ServiceMonitor" not in kinds(render(helm_bin, "metrics.serviceMonitor.enabled=true"))
    # An empty priorityClassName leaves the field out (the cluster's default priority).
    unset = render(helm_bin, "priorityClassName=", "agent.enabled=true", "agent.priorityClassName=")
    assert "priorityClassName" not in one(unset, "Deployment")["spec"]["template"]["spec"]
    assert "priorityClassName" not in one(unset, "DaemonSet")["spec"]["template"]["spec"]


def test_operator_deployment_meets_restricted_pod_security(helm_bin: str) -> None:
    deploy = one(render(helm_bin), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    psc, csc = pod["securityContext"], container["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == 65532
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in csc["capabilities"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert not any("hostPath" in v for v in pod["volumes"])
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUEFF_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    args = container["args"]
    assert args[0] == "run"
    assert "--leader-election" in args
    assert "--metrics-port=8080" in args
    assert "--health-port=8081" in args
    assert (
        env["GPUEFF_PROTECTED_NAMESPACES"]["value"] == "gpu-eff"
    )  # env: `kubectl exec ... report` reads it too
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"] == "512Mi"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"


def test_operator_args_follow_values(helm_bin: str, tmp_path: Path) -> None:
    values = {
        "operator": {"dryRun": True, "logFormat": "text", "protectedNamespaces": ["ml-prod"]},
        "prometheus": {
            "url": "https://thanos.example:9091",
            "matchers": 'job="dcgm"',
            "bearerToken": {"secretName": "prom-token"},
            "ca": {"configMapName": "prom-ca"},
            "headers": {"X-Scope-OrgID": "gpu-team", "THANOS-TENANT": "gpu-team|ml"},
        },
        "replicaCount": 1,
        "priorityClassName": "system-cluster-critical",
        "image": {"digest": "sha256:" + "a" * 64},
    }
    docs = render(helm_bin, values=values, tmp=tmp_path)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert "--dry-run" in args
    assert "--log-format=text" in args
    # Connection settings travel as GPUEFF_* variables, so `report` run in the container uses them too.
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUEFF_PROTECTED_NAMESPACES"] == "gpu-eff,ml-prod"
    assert env["GPUEFF_PROMETHEUS_URL"] == "https://thanos.example:9091"
    assert env["GPUEFF_PROMETHEUS_MATCHERS"] == 'job="dcgm"'
    assert env["GPUEFF_PROMETHEUS_TOKEN_FILE"] == "/etc/gpu-efficiency/prometheus-token/token"
    assert env["GPUEFF_PROMETHEUS_CA_FILE"] == "/etc/gpu-efficiency/prometheus-ca/ca.crt"
    # the operator reads the list back as the map the values gave
    assert env["GPUEFF_PROMETHEUS_HEADERS"] == "THANOS-TENANT: gpu-team|ml,X-Scope-OrgID: gpu-team"
    assert parse_headers(env["GPUEFF_PROMETHEUS_HEADERS"].split(",")) == {
        "X-Scope-OrgID": "gpu-team",
        "THANOS-TENANT": "gpu-team|ml",
    }
    assert container["image"] == "gpu-efficiency-operator@sha256:" + "a" * 64
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prom-ca"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert "PodDisruptionBudget" not in kinds(docs)  # one replica: a PDB would block node drains


def _granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    got: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                got.setdefault((group, resource), set()).update(rule["verbs"])
    return got


def test_operator_cluster_role_is_exactly_least_privilege(helm_bin: str) -> None:
    docs = render(helm_bin)
    role = one(docs, "ClusterRole")
    assert _granted(role) == EXPECTED_OBSERVE_RULES  # rbac.mode=observe is the default
    assert _granted(one(render(helm_bin, "rbac.mode=observe"), "ClusterRole")) == EXPECTED_OBSERVE_RULES
    enforce = one(render(helm_bin, "rbac.mode=enforce"), "ClusterRole")
    assert _granted(enforce) == EXPECTED_ENFORCE_RULES
    for rules in (role["rules"], enforce["rules"]):
        flat = json.dumps(rules)
        assert "*" not in flat
        assert "secrets" not in flat
    deleters = {
        (g, r)
        for rule in enforce["rules"]
        if "delete" in rule["verbs"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert deleters == {("resource.k8s.io", "devicetaintrules")}, "delete: only our own DeviceTaintRules"
    assert not any("delete" in rule["verbs"] for rule in role["rules"]), "observe deletes nothing"
    proc = run(helm_bin, "template", "x", str(CHART), "--set", "rbac.mode=admin", expect_failure=True)
    assert "rbac/mode" in proc.stderr, proc.stderr
    lease_role = one(docs, "Role")
    assert lease_role["metadata"]["namespace"] == "gpu-eff"
    assert {r["resources"][0] for r in lease_role["rules"]} == {"leases"}
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpueff-gpu-efficiency-operator", "namespace": "gpu-eff"}
    ]


def test_agent_daemonset(helm_bin: str) -> None:
    docs = render(helm_bin, "agent.enabled=true", "agent.runtimeClassName=nvidia")
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"  # the kubelet evicts it last
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerations = pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "gpuefficiency.io/gpu-fault", "operator": "Exists"} in tolerations  # every effect
    assert container["args"][:2] == ["agent", "--listen=0.0.0.0:9400"]
    assert "--node-name=$(NODE_NAME)" in container["args"]
    assert "--write-node-condition" not in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    csc = container["securityContext"]
    assert csc["privileged"] is False
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"] == {"drop": ["ALL"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount["readOnly"] is True
    host = next(v for v in pod["volumes"] if v["name"] == "pod-resources")["hostPath"]
    assert host["path"] == "/var/lib/kubelet/pod-resources"
    # No RBAC at all for the agent unless it writes the node condition.
    agent_rbac = [
        d
        for d in docs
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding") and "agent" in d["metadata"]["name"]
    ]
    assert agent_rbac == []
    with_condition = render(helm_bin, "agent.enabled=true", "agent.writeNodeCondition=true")
    role = one(with_condition, "ClusterRole", "-agent")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]}]
    ds_pod = one(with_condition, "DaemonSet")["spec"]["template"]["spec"]
    assert ds_pod["automountServiceAccountToken"] is True
    assert "--write-node-condition" in ds_pod["containers"][0]["args"]


def test_monitoring_objects_and_alert_rules(helm_bin: str, tmp_path: Path) -> None:
    docs = render(helm_bin, *ALL_ON, api_versions=True)
    assert len([d for d in docs if d["kind"] == "ServiceMonitor"]) == 2
    rule = one(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "GPUEfficiencyOperatorDown",
        "GPUEfficiencyNoLeader",
        "GPUEfficiencyMetricsUnavailable",
        "GPUEfficiencyCircuitBreakerOpen",
        "GPUEfficiencyEvictionsBlocked",
        "GPUEfficiencyCyclesFailing",
        "GPUEfficiencyCycleStalled",
        "GPUEfficiencyCyclesAbsent",
        "GPUEfficiencyIdleGPUReclaimPending",
    }
    assert alerts["GPUEfficiencyOperatorDown"]["expr"].startswith("absent(up{")
    assert "absent(gpu_efficiency_leader{" in alerts["GPUEfficiencyNoLeader"]["expr"]
    assert "gpu_efficiency_metrics_available" in alerts["GPUEfficiencyMetricsUnavailable"]["expr"]
    assert alerts["GPUEfficiencyMetricsUnavailable"]["for"] == "10m"
    assert "gpu_efficiency_circuit_breaker_open" in alerts["GPUEfficiencyCircuitBreakerOpen"]["expr"]
    assert 'result="blocked"' in alerts["GPUEfficiencyEvictionsBlocked"]["expr"]
    assert 'result="error"' in alerts["GPUEfficiencyCyclesFailing"]["expr"]
    assert "gpu_efficiency_last_cycle_timestamp_seconds" in alerts["GPUEfficiencyCycleStalled"]["expr"]
    assert "gpu_efficiency_policies" in alerts["GPUEfficiencyCyclesAbsent"]["expr"]
    for name, alert in alerts.items():
        assert alert["annotations"]["runbook_url"] == f"docs/operations.md#{name.lower()}", name
    based = render(
        helm_bin, *ALL_ON, "prometheusRule.runbookBaseUrl=https://docs.example/ops.md", api_versions=True
    )
    urls = {
        r["annotations"]["runbook_url"]
        for g in one(based, "PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
    }
    assert urls == {f"https://docs.example/ops.md#{a.lower()}" for a in alerts}
    # promtool (built with the local cluster's Prometheus) parses every expression.
    promtool = built_tool("promtool", "PROMTOOL")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = run(promtool, "check", "rules", str(rules_file)).stdout
    assert "SUCCESS: 9 rules found" in out, out
    # The dashboard is valid JSON, labelled for the Grafana sidecar, and charts every operator metric.
    dashboard_cm = one(docs, "ConfigMap", "-dashboard")
    assert dashboard_cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(dashboard_cm["data"]["gpu-efficiency.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in OPERATOR_METRICS:
        assert metric in exprs, metric
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("idle", "waste", "diagnos", "tainted", "evictions"):
        assert topic in titles, topic
    # issue 33: reclaims, GPU-hours returned, warned pods, dropped samples, stragglers, blind spots
    # and a per-namespace view, each from a metric the operator exports
    for metric in (
        "gpu_efficiency_reclaims_total",
        "gpu_efficiency_gpu_hours_returned_total",
        "gpu_efficiency_pod_eviction_pending",
        "gpu_efficiency_dropped_samples_total",
        "gpu_efficiency_straggler_gpus",
        'verdict="Unknown"',
        "gpu_efficiency_notifications_total",
    ):
        assert metric in exprs, metric
    for topic in (
        "reclaims",
        "gpu-hours returned",
        "warned",
        "dropped samples",
        "straggler",
        "blind spots",
        "by namespace",
    ):
        assert topic in titles, topic


def test_the_reclaim_pending_alert_passes_its_promtool_unit_test(helm_bin: str, tmp_path: Path) -> None:
    """`promtool test rules` with tests/e2e/promtool/: the alert carries the pod's own namespace and
    name (not the operator's), ends with the keep command, and clears when the warning's series goes."""
    docs = render(helm_bin, *ALL_ON, namespace="default", api_versions=True)
    rule = one(docs, "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    test_file = tmp_path / "idle_reclaim_pending.test.yaml"
    test_file.write_text((Path(__file__).parent / "promtool" / "idle_reclaim_pending.test.yaml").read_text())
    out = run(built_tool("promtool", "PROMTOOL"), "test", "rules", str(test_file))
    assert "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (("replicaCount=-1",), "replicaCount"),
        (("metrics.port=abc",), "metrics/port"),
        (("operator.logFormat=xml",), "operator/logFormat"),
        (("image.pullPolicy=Sometimes",), "image/pullPolicy"),
        (("agent.securityContext.privileged=true",), "agent/securityContext/privileged"),
        (("replicaCuont=3",), "replicaCuont"),
        (("operator.leaderElection=false",), "operator.leaderElection=true"),
        (("metrics.port=8081",), "metrics.port and health.port must differ"),
        (("image.tag=latest",), "latest is not allowed"),
        (
            ("prometheus.headers.Authorization=Bearer x",),
            "prometheus.headers.Authorization is set by the operator",
        ),
        (("prometheus.headers.X Scope=a",), "invalid propertyName 'X Scope'"),
        (("prometheus.headers.X-Scope-OrgID=a\\,b",), "prometheus/headers/X-Scope-OrgID"),
    ],
)
def test_bad_values_fail_with_a_readable_message(helm_bin: str, sets: tuple[str, ...], expected: str) -> None:
    args = [helm_bin, "template", "gpueff", str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run(*args, expect_failure=True)
    assert expected in proc.stderr, proc.stderr


# --- against the API server --------------------------------------------------------------------


def test_rendered_chart_passes_server_side_dry_run(helm_bin: str, cluster: Cluster, namespace: str) -> None:
    """Everything the chart can render is accepted by the API server (schemas, CRD validation of the policy),
    and the operator alone meets Pod Security "restricted" (the API server warns on any violation)."""
    cluster.kubectl_run("label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted")
    release = f"dry-{uuid.uuid4().hex[:5]}"

    def dry_run(*sets: str) -> str:
        rendered = run(
            helm_bin,
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            *[a for s in (*sets, f"policy.name={release}") for a in ("--set", s)],
        ).stdout
        proc = run(
            cluster.kubectl,
            "apply",
            "--dry-run=server",
            "-n",
            namespace,
            "-f",
            "-",
            input_=rendered,
            kubeconfig=cluster.kubeconfig,
        )
        assert "(server dry run)" in proc.stdout, proc.stdout
        return proc.stdout + proc.stderr

    operator_only = dry_run("policy.create=true")
    assert "deployment.apps/" in operator_only
    assert "gpuefficiencypolicy.gpuefficiency.io/" in operator_only
    assert "would violate PodSecurity" not in operator_only, operator_only
    everything = dry_run(*ALL_ON)
    assert "daemonset.apps/" in everything
    # The check above can fail: the agent (hostPath, uid 0) is not "restricted", and the server says so.
    assert "would violate PodSecurity" in everything, everything


def can_i(cluster: Cluster, who: str, *args: str) -> bool:
    proc = subprocess.run(
        [cluster.kubectl, "auth", "can-i", f"--as={who}", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
        timeout=60,
    )
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return answer == "yes"


@pytest.fixture
def release(helm_bin: str, cluster: Cluster, namespace: str) -> Iterator[str]:
    """A release name; uninstalled at teardown if the test left it installed."""
    name = f"ge-{uuid.uuid4().hex[:5]}"
    yield name
    installed = run(helm_bin, "list", "-q", "-n", namespace, kubeconfig=cluster.kubeconfig).stdout.split()
    if name in installed:
        run(
            helm_bin,
            "uninstall",
            name,
            "--namespace",
            namespace,
            "--wait",
            "--timeout",
            "2m",
            kubeconfig=cluster.kubeconfig,
        )


def test_helm_install_and_least_privilege(
    helm_bin: str, cluster: Cluster, namespace: str, release: str
) -> None:
    kc = cluster.kubeconfig
    run(
        helm_bin,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "agent.enabled=true",
        kubeconfig=kc,
    )
    status = json.loads(run(helm_bin, "status", release, "-n", namespace, "-o", "json", kubeconfig=kc).stdout)
    assert status["info"]["status"] == "deployed"
    cluster.kubectl_run(
        "-n",
        namespace,
        "get",
        f"deployment/{release}-gpu-efficiency-operator",
        f"daemonset/{release}-gpu-efficiency-operator-agent",
        f"service/{release}-gpu-efficiency-operator-metrics",
    )
    cluster.kubectl_run("get", "crd", "gpuefficiencypolicies.gpuefficiency.io")

    op = f"system:serviceaccount:{namespace}:{release}-gpu-efficiency-operator"
    allowed = [
        ("patch", "pods", "-A"),
        ("list", "pods", "-A"),
        ("watch", "pods", "-A"),
        ("get", "pods", "-A"),  # the self-service click's re-read (list already reads every pod)
        ("patch", "nodes"),
        ("patch", "nodes", "--subresource=status"),
        ("list", "namespaces"),
        ("watch", "namespaces"),
        ("watch", "nodes"),
        ("create", "events", "-n", "default"),
        ("list", "gpuefficiencypolicies.gpuefficiency.io"),
        ("get", "gpuefficiencypolicies.gpuefficiency.io"),
        ("patch", "gpuefficiencypolicies.gpuefficiency.io", "--subresource=status"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("list", "resourceslices.resource.k8s.io"),
        ("watch", "resourceslices.resource.k8s.io"),
        ("watch", "devicetaintrules.resource.k8s.io"),
        ("watch", "replicasets.apps", "-A"),  # the owner cache
        ("watch", "poddisruptionbudgets.policy", "-A"),
        ("create", "leases.coordination.k8s.io", "-n", namespace),
        ("update", "leases.coordination.k8s.io/gpu-efficiency-operator", "-n", namespace),
    ]
    denied = [
        ("get", "secrets", "-A"),
        ("list", "secrets", "-n", namespace),
        ("get", "secrets", "-n", "kube-system"),
        ("delete", "nodes"),
        ("delete", "pods", "-A"),
        ("create", "pods", "-n", "default"),
        ("update", "pods", "-A"),
        ("create", "deployments.apps", "-n", "default"),
        ("delete", "deployments.apps", "-n", namespace),
        ("get", "configmaps", "-A"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
        ("bind", "clusterroles.rbac.authorization.k8s.io"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("delete", "gpuefficiencypolicies.gpuefficiency.io"),
        ("patch", "gpuefficiencypolicies.gpuefficiency.io"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("delete", "resourceclaims.resource.k8s.io", "-A"),
        ("create", "leases.coordination.k8s.io", "-n", "default"),
        ("update", "leases.coordination.k8s.io/someone-else", "-n", namespace),
        ("create", "serviceaccounts", "--subresource=token", "-n", namespace),
        ("*", "*"),
    ]
    # What only rbac.mode=enforce grants: under the default observe, all of it is refused.
    enforce_only = [
        ("create", "pods", "--subresource=eviction", "-A"),
        ("create", "devicetaintrules.resource.k8s.io"),
        ("delete", "devicetaintrules.resource.k8s.io"),
        ("list", "resourceclaims.resource.k8s.io"),
        ("patch", "deployments.apps", "--subresource=scale", "-A"),
        ("patch", "deployments.apps", "-A"),
        ("patch", "jobs.batch", "-A"),
    ]
    assert [a for a in allowed if not can_i(cluster, op, *a)] == []
    assert [d for d in [*denied, *enforce_only] if can_i(cluster, op, *d)] == []

    agent = f"system:serviceaccount:{namespace}:{release}-gpu-efficiency-operator-agent"
    # Without --write-node-condition the agent has no RBAC at all.
    assert [
        a
        for a in [("get", "nodes"), ("patch", "nodes", "--subresource=status"), ("list", "pods", "-A")]
        if can_i(cluster, agent, *a)
    ] == []
    run(
        helm_bin,
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--reuse-values",
        "--set",
        "agent.writeNodeCondition=true",
        "--set",
        "rbac.mode=enforce",
        kubeconfig=kc,
    )
    assert [a for a in [*allowed, *enforce_only] if not can_i(cluster, op, *a)] == []
    assert [d for d in denied if can_i(cluster, op, *d)] == []
    assert can_i(cluster, agent, "get", "nodes", "--subresource=status")
    assert can_i(cluster, agent, "patch", "nodes", "--subresource=status")
    assert [
        d
        for d in [
            ("get", "nodes"),
            ("patch", "nodes"),
            ("list", "nodes"),
            ("delete", "nodes"),
            ("get", "pods", "-A"),
            ("get", "secrets", "-A"),
        ]
        if can_i(cluster, agent, *d)
    ] == []

    run(helm_bin, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m", kubeconfig=kc)
    gone = cluster.kubectl_run("get", "clusterrole", f"{release}-gpu-efficiency-operator", check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
    assert not can_i(cluster, op, "patch", "pods", "-A")


# --- agent exposure and admission policies (issue 19, findings 9 and 10) ------------------------

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def test_agent_network_policy_admits_only_the_operator_and_prometheus(helm_bin: str) -> None:
    docs = render(helm_bin, "agent.enabled=true")
    policy = one(docs, "NetworkPolicy", "-agent")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "node-agent"
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    operator, prometheus = rule["from"]
    assert operator == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "gpu-efficiency-operator",
                "app.kubernetes.io/instance": "gpueff",
                "app.kubernetes.io/component": "operator",
            }
        }
    }
    assert prometheus["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    no_prometheus = render(
        helm_bin,
        "agent.enabled=true",
        "agent.networkPolicy.prometheus.namespaceSelector=null",
        "agent.networkPolicy.prometheus.podSelector=null",
    )
    assert len(one(no_prometheus, "NetworkPolicy")["spec"]["ingress"][0]["from"]) == 1
    off = render(helm_bin, "agent.enabled=true", "agent.networkPolicy.enabled=false")
    assert "NetworkPolicy" not in kinds(off)
    assert "NetworkPolicy" not in kinds(render(helm_bin))  # no agent, no policy


def test_agent_limits_and_optional_token_authentication(helm_bin: str) -> None:
    docs = render(helm_bin, "agent.enabled=true")
    args = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--max-connections=32" in args
    assert "--request-timeout=10s" in args
    assert not any(a.startswith("--auth") for a in args)
    assert not [
        d for d in docs if d["kind"] == "ClusterRoleBinding" and "auth-delegator" in d["metadata"]["name"]
    ]
    deploy_args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--agent-token-file") for a in deploy_args)

    on = render(
        helm_bin,
        "agent.enabled=true",
        "agent.auth.enabled=true",
        "agent.serviceMonitor.enabled=true",
        "agent.auth.readers[0].kind=ServiceAccount",
        "agent.auth.readers[0].name=prometheus",
        "agent.auth.readers[0].namespace=monitoring",
        api_versions=True,
    )
    pod = one(on, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # it calls TokenReview
    assert "--auth=tokenreview" in pod["containers"][0]["args"]
    delegator = one(on, "ClusterRoleBinding", "-agent-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"][0]["name"] == "gpueff-gpu-efficiency-operator-agent"
    role = one(on, "ClusterRole", "-agent-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics", "/snapshot"], "verbs": ["get"]}]
    subjects = one(on, "ClusterRoleBinding", "-agent-reader")["subjects"]
    assert [(s["kind"], s.get("namespace"), s["name"]) for s in subjects] == [
        ("ServiceAccount", "gpu-eff", "gpueff-gpu-efficiency-operator"),
        ("ServiceAccount", "monitoring", "prometheus"),
    ]
    deploy_args = one(on, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--agent-token-file=/var/run/secrets/kubernetes.io/serviceaccount/token" in deploy_args
    endpoint = one(on, "ServiceMonitor", "-agent")["spec"]["endpoints"][0]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_admission_policies_narrow_each_service_account(helm_bin: str) -> None:
    # the API server does not serve it: nothing, but a WARNING comment in the output says so
    assert not [d for d in render(helm_bin) if "Admission" in d["kind"]]
    out = run(helm_bin, "template", "gpueff", str(CHART)).stdout
    assert "WARNING: admissionPolicy.enabled is true but the ValidatingAdmissionPolicies" in out
    docs = render(helm_bin, "agent.enabled=true", apis=(VAP_API,))
    names = {(d["kind"], d["metadata"]["name"]) for d in docs if "Admission" in d["kind"]}
    assert names == {
        (kind, f"gpueff-gpu-efficiency-operator-{suffix}")
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        for suffix in ("operator", "workloads", "protected-namespaces", "device-taints")
    }  # the agent writes nothing without writeNodeCondition: no policy for it
    workloads = one(docs, "ValidatingAdmissionPolicy", "-workloads")["spec"]
    covered = {
        (g, r)
        for rule in workloads["matchConstraints"]["resourceRules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    # every workload kind the enforce ClusterRole may patch, and its /scale
    patched = {
        k
        for k, v in EXPECTED_ENFORCE_RULES.items()
        if "patch" in v and k[0] not in ("", "resource.k8s.io", "gpuefficiency.io")
    }
    assert {k for k in patched if not k[1].endswith("/scale")} <= covered
    assert {(g, f"{r}/scale") for g, r in covered if not r.endswith("/scale")} <= covered
    assert all(rule["operations"] == ["UPDATE"] for rule in workloads["matchConstraints"]["resourceRules"])
    protected = one(docs, "ValidatingAdmissionPolicy", "-protected-namespaces")["spec"]
    (rule,) = protected["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["*/*"]
    assert rule["apiGroups"] == ["*"]
    never = protected["validations"][0]["expression"]
    for ns in ("kube-system", "kube-public", "kube-node-lease", "gpu-eff"):
        assert f'"{ns}"' in never, ns
    devices = one(docs, "ValidatingAdmissionPolicy", "-device-taints")["spec"]
    assert devices["matchConstraints"]["resourceRules"][0]["resources"] == ["devicetaintrules"]
    assert devices["matchConditions"][0]["expression"].endswith(
        "'system:serviceaccount:gpu-eff:gpueff-gpu-efficiency-operator'"
    )
    device_text = " ".join(v["expression"] for v in devices["validations"])
    for needle in (
        "'gpu-efficiency-operator'",
        "object.spec.deviceSelector.device",
        "'gpuefficiency.io/gpu-fault'",
    ):
        assert needle in device_text, needle
    policy = one(docs, "ValidatingAdmissionPolicy", "-operator-operator")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [
        {
            "name": "operator-service-account",
            "expression": "request.userInfo.username == "
            "'system:serviceaccount:gpu-eff:gpueff-gpu-efficiency-operator'",
        }
    ]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"]) == (["UPDATE"], ["pods", "nodes", "nodes/status"])
    text = " ".join(v["expression"] for v in spec["validations"])
    for needle in (
        "gpuefficiency.io/",
        "'gpuefficiency.io/gpu-fault'",
        "'GPUHealthy'",
        "object.spec == oldObject.spec",
    ):
        assert needle in text, needle
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "-operator-operator")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}

    agent = render(helm_bin, "agent.enabled=true", "agent.writeNodeCondition=true", apis=(VAP_API,))
    agent_policy = one(agent, "ValidatingAdmissionPolicy", "-agent")["spec"]
    assert agent_policy["matchConditions"][0]["expression"].endswith(
        "'system:serviceaccount:gpu-eff:gpueff-gpu-efficiency-operator-agent'"
    )
    own_node = agent_policy["validations"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in own_node
    assert "object.metadata.name" in own_node
    assert one(agent, "ValidatingAdmissionPolicyBinding", "-agent")["spec"]["validationActions"] == ["Deny"]
    assert not [
        d
        for d in render(helm_bin, "admissionPolicy.enabled=false", apis=(VAP_API,))
        if "Admission" in d["kind"]
    ]


# --- issue 33: names, alert gating, RBAC modes and admission policies against the API server ------


@pytest.mark.parametrize(
    ("release", "sets", "name"),
    [
        ("gpu-efficiency", (), "gpu-efficiency-operator"),  # the README's release: no doubled name
        ("gpu-efficiency-operator", (), "gpu-efficiency-operator"),
        ("gpueff", (), "gpueff-gpu-efficiency-operator"),
        ("gpueff", ("fullnameOverride=gpu-eff",), "gpu-eff"),
        ("team", ("nameOverride=gpueff",), "team-gpueff"),
    ],
)
def test_resource_names_follow_helm_create_without_doubling(
    helm_bin: str, release: str, sets: tuple[str, ...], name: str
) -> None:
    docs = render(helm_bin, *sets, release=release)
    assert one(docs, "Deployment")["metadata"]["name"] == name
    assert one(docs, "ClusterRole")["metadata"]["name"] == name


def test_alert_rules_need_a_scrape_of_the_operator(helm_bin: str) -> None:
    """The rules select the operator's scrape job: without the chart's ServiceMonitor (or a job named
    in prometheusRule.job) OperatorDown and NoLeader would fire forever, so nothing is rendered and
    the output says why; without --api-versions the same."""
    apis = ("prometheusRule.enabled=true",)
    assert "PrometheusRule" not in kinds(render(helm_bin, *apis, api_versions=True))
    out = run(
        helm_bin,
        "template",
        "gpueff",
        str(CHART),
        "--set",
        "prometheusRule.enabled=true",
        *[a for api in MONITORING_APIS for a in ("--api-versions", api)],
    ).stdout
    assert "nothing scrapes the operator as the rules expect" in out
    job = render(helm_bin, *apis, "prometheusRule.job=my-scrape", api_versions=True)
    expr = one(job, "PrometheusRule")["spec"]["groups"][0]["rules"][0]["expr"]
    assert 'job="my-scrape"' in expr
    with_sm = render(helm_bin, *apis, "metrics.serviceMonitor.enabled=true", api_versions=True)
    assert kinds(with_sm).count("PrometheusRule") == 1
    bare = run(
        helm_bin,
        "template",
        "gpueff",
        str(CHART),
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ).stdout
    assert "does not serve monitoring.coreos.com/v1 PrometheusRule" in bare
    assert "no ServiceMonitor was rendered" in bare


def test_admission_policies_refuse_the_operator_what_it_does_not_need(
    helm_bin: str, cluster: Cluster, namespace: str, k8s: Any
) -> None:
    """The real API server enforces the chart's policies on the operator's ServiceAccount
    (impersonated), with rbac.mode=enforce so RBAC alone would allow every request below: a pod
    template or replicas changed on a Deployment, a label, a foreign annotation, a Job's spec beyond
    suspend, and any write in kube-system are refused; /scale, spec.suspend and our annotations pass."""
    release_ns = create_namespace(k8s, "vap-op")
    release = f"vap-{uuid.uuid4().hex[:5]}"
    probe = f"vap-probe-{uuid.uuid4().hex[:5]}"
    kc = cluster.kubeconfig
    try:
        run(
            helm_bin,
            "install",
            release,
            str(CHART),
            "--namespace",
            release_ns,
            "--set",
            "rbac.mode=enforce",
            "--set",
            "replicaCount=1",
            kubeconfig=kc,
        )
        as_operator = cluster.api_client()
        as_operator.set_default_header(
            "Impersonate-User", f"system:serviceaccount:{release_ns}:{release}-gpu-efficiency-operator"
        )
        apps, batch = client.AppsV1Api(as_operator), client.BatchV1Api(as_operator)
        core, leases = client.CoreV1Api(as_operator), client.CoordinationV1Api(as_operator)

        def answer(call: Callable[[], object]) -> str:
            try:
                call()
            except ApiException as exc:
                return str(json.loads(exc.body or "{}").get("message", exc.reason))
            return "allowed"

        cluster.kubectl_run("create", "deployment", "web", "--image=pause:3.9", "-n", namespace)
        cluster.kubectl_run("create", "job", "train", "--image=pause:3.9", "-n", namespace)
        cluster.kubectl_run("create", "deployment", probe, "--image=pause:3.9", "-n", "kube-system")

        def annotate(name: str, ns: str, key: str) -> str:
            body = {"metadata": {"annotations": {key: uuid.uuid4().hex}}}
            return answer(lambda: apps.patch_namespaced_deployment(name, ns, body))

        # The API server loads policies asynchronously: wait until a foreign annotation is refused.
        wait_for(
            lambda: "denied request" in annotate("web", namespace, "x"),
            60,
            what="the workloads admission policy in force",
        )
        template = {"spec": {"template": {"spec": {"serviceAccountName": "admin"}}}}
        refused = {
            "pod template": answer(lambda: apps.patch_namespaced_deployment("web", namespace, template)),
            "replicas on the object": answer(
                lambda: apps.patch_namespaced_deployment("web", namespace, {"spec": {"replicas": 5}})
            ),
            "label": answer(
                lambda: apps.patch_namespaced_deployment(
                    "web", namespace, {"metadata": {"labels": {"app": "other"}}}
                )
            ),
            "job deadline": answer(
                lambda: batch.patch_namespaced_job("train", namespace, {"spec": {"activeDeadlineSeconds": 5}})
            ),
            "kube-system annotation": annotate(probe, "kube-system", "gpuefficiency.io/x"),
            "kube-system scale": answer(
                lambda: apps.patch_namespaced_deployment_scale(
                    probe, "kube-system", {"spec": {"replicas": 0}}
                )
            ),
            "kube-system event": answer(
                lambda: core.create_namespaced_event(
                    "kube-system",
                    client.CoreV1Event(
                        metadata=client.V1ObjectMeta(generate_name="gpueff-"),
                        involved_object=client.V1ObjectReference(
                            kind="Deployment", name=probe, namespace="kube-system"
                        ),
                        reason="Probe",
                    ),
                )
            ),
        }
        assert {k: "denied request" in v for k, v in refused.items()} == dict.fromkeys(refused, True), refused
        assert "may change only spec.suspend or spec.active" in refused["pod template"]
        assert "may not change a workload's labels" in refused["label"]
        assert "protected namespace kube-system" in refused["kube-system scale"]
        assert "protected namespace kube-system" in refused["kube-system event"]
        allowed = {
            "our annotation": annotate("web", namespace, "gpuefficiency.io/previous-replicas"),
            "suspend": answer(
                lambda: batch.patch_namespaced_job("train", namespace, {"spec": {"suspend": True}})
            ),
            "scale": answer(
                lambda: apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 0}})
            ),
            "its Lease, in its own protected namespace": answer(
                lambda: leases.create_namespaced_lease(
                    release_ns,
                    client.V1Lease(metadata=client.V1ObjectMeta(name="gpu-efficiency-operator")),
                )
            ),
        }
        assert allowed == dict.fromkeys(allowed, "allowed")
        web = client.AppsV1Api(k8s).read_namespaced_deployment("web", namespace)
        assert web.spec.replicas == 0
        assert web.spec.template.spec.service_account_name is None
        assert client.BatchV1Api(k8s).read_namespaced_job("train", namespace).spec.suspend is True
    finally:
        run(
            helm_bin,
            "uninstall",
            release,
            "--namespace",
            release_ns,
            "--wait",
            "--timeout",
            "2m",
            kubeconfig=kc,
        )
        cluster.kubectl_run(
            "delete", "deployment", probe, "-n", "kube-system", "--ignore-not-found", check=False
        )
        delete_namespace(k8s, release_ns)
