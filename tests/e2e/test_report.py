"""`gpu-efficiency report` and `explain` on the local cluster against a known scenario, including
their output when Prometheus or the cluster cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import yaml
from kubernetes import client

from gpu_efficiency_sim.runner import RunOptions, run_scenario
from tests.e2e.harness import Cluster
from tests.e2e.scenario_driver import scenario_report

HERE = Path(__file__).parent / "report"
POLICY = HERE / "policy.yaml"
DEAD_URL = "http://127.0.0.1:9"  # nothing listens on the discard port


def cli(cluster: Cluster, *args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig or cluster.kubeconfig}
    return subprocess.run(
        [sys.executable, "-m", "gpu_efficiency.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_report_and_explain(cluster: Cluster, k8s: client.ApiClient, tmp_path: Path) -> None:
    prefix = f"r{uuid.uuid4().hex[:4]}-"
    namespace = prefix + "sim-report"
    out: dict[str, subprocess.CompletedProcess[str]] = {}

    def take_reports() -> None:
        pods = client.CoreV1Api(k8s).list_namespaced_pod(namespace).items
        notebook = next(p.metadata.name for p in pods if p.metadata.name.startswith("notebook-"))
        common = ("--policy-file", str(POLICY), "--prometheus-url", cluster.prometheus_url)
        out["json"] = cli(cluster, "report", *common, "-o", "json")
        out["table"] = cli(cluster, "report", *common)
        out["explain"] = cli(cluster, "explain", f"{namespace}/{notebook}", *common)
        out["explain_json"] = cli(cluster, "explain", f"{namespace}/{notebook}", *common, "-o", "json")
        down = ("--policy-file", str(POLICY), "--prometheus-url", DEAD_URL)
        out["prom_down"] = cli(cluster, "report", *down)
        out["explain_down"] = cli(cluster, "explain", f"{namespace}/{notebook}", *down)
        out["missing_pod"] = cli(cluster, "explain", f"{namespace}/no-such-pod", *common)
        # kubectl style: -n is the namespace looked at, -o yaml, the pod by name in -n
        out["one_ns_yaml"] = cli(cluster, "report", *common, "-n", namespace, "-o", "yaml")
        out["other_ns"] = cli(cluster, "report", *common, "-n", "kube-system", "-o", "json")
        out["explain_n"] = cli(cluster, "explain", notebook, "-n", namespace, *common, "-o", "yaml")

    lines: list[str] = []
    result = run_scenario(
        HERE / "report-scenario.yaml",
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=cluster.prometheus_url,
            targets_dir=cluster.prometheus_targets_dir(),
            operator=False,
            namespace_prefix=prefix,
            log_dir=tmp_path,
            output=lines.append,
            before_teardown=take_reports,
        ),
    )
    assert result.passed, scenario_report(lines, result)

    report = json.loads(out["json"].stdout)
    assert out["json"].returncode == 0, out["json"].stderr
    assert report["metricsAvailable"] is True
    # the inventory query, in the real Prometheus, tells each simulated GPU's exporter generation
    assert report["exporters"]["generations"], report["exporters"]
    assert "unknown" not in report["exporters"]["generations"], report["exporters"]
    rows = {r["namespace"]: r for r in report["namespaces"]}
    row = rows[namespace]
    assert (row["pods"], row["gpus"]) == (2, 3)
    assert row["idleGpuHoursPerDay"] == 24.0  # the notebook's one GPU
    assert row["estimatedWastePerDay"] == 96.0  # 24 h x 4.0 per H100-hour
    verdicts = {
        p["pod"].split("/")[1].rsplit("-", 2)[0]: p for p in report["pods"] if p["pod"].startswith(namespace)
    }
    assert verdicts["notebook"]["verdict"] == "Idle"
    assert verdicts["trainer"]["verdict"] == "Efficient"
    assert verdicts["trainer"]["activitySignal"] == "SM_ACTIVE"
    # The report judges as Enforce would: the idle notebook shows as a would-be action or a note.
    assert "NAMESPACE" in out["table"].stdout
    assert namespace in out["table"].stdout

    explain = out["explain"].stdout
    assert out["explain"].returncode == 0, out["explain"].stderr
    for needle in ("Idle", "DCGM_FI_PROF_SM_ACTIVE", "activityBelow", "window"):
        assert needle in explain, f"{needle!r} missing from explain:\n{explain}"
    assert json.loads(out["explain_json"].stdout)["verdict"] == "Idle"

    assert out["prom_down"].returncode == 4
    assert "METRICS UNAVAILABLE" in out["prom_down"].stdout
    assert "127.0.0.1:9" in out["prom_down"].stdout
    assert out["explain_down"].returncode == 4
    assert "METRICS UNAVAILABLE" in out["explain_down"].stdout
    assert out["missing_pod"].returncode == 2
    assert "not a running pod holding GPUs" in out["missing_pod"].stderr

    one = yaml.safe_load(out["one_ns_yaml"].stdout)
    assert out["one_ns_yaml"].returncode == 0, out["one_ns_yaml"].stderr
    assert one["namespace"] == namespace
    assert [r["namespace"] for r in one["namespaces"]] == [namespace]
    assert {p["pod"].split("/")[0] for p in one["pods"]} == {namespace}
    assert json.loads(out["other_ns"].stdout)["pods"] == []  # -n filters; it no longer sets a protection
    assert yaml.safe_load(out["explain_n"].stdout)["verdict"] == "Idle"


def test_report_when_the_cluster_is_unreachable(cluster: Cluster, tmp_path: Path) -> None:
    dead = tmp_path / "kubeconfig"
    dead.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    proc = cli(cluster, "report", "--prometheus-url", cluster.prometheus_url, kubeconfig=str(dead))
    assert proc.returncode == 3, proc.stderr
    assert "cannot reach the Kubernetes API" in proc.stderr
    assert "Traceback" not in proc.stderr
