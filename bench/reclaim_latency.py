"""Reclaim to running: from the operator scaling an idle Deployment to zero to the pod that waited
for its GPU running there, and the API writes one reclamation costs.

    GPUEFF_STATE_DIR=/tmp/gpueff-NAME GPUEFF_PORT_OFFSET=N python bench/reclaim_latency.py [--runs 5]

Uses the local cluster of that state dir (``cluster.sh up`` when it is not running; never the
default one), the chart's RBAC and the operator as a process with its ServiceAccount token. Each
run plays a scenario (gpu_efficiency_sim's runner): one KWOK node with one GPU, held by an idle
Deployment (``idleFor`` 5s, ``warningPeriod`` 5s, interval 5s, the default ScaleToZero). Once that
pod runs, a 1-GPU pod for the same node is created in ``default`` (outside the policy's scope, so
none of the operator's writes are for it); it waits Pending. Watching both:

* t_action: the watch event showing the Deployment at 0 replicas (the operator's /scale write);
* t_scheduled, t_running: the watch events showing the waiting pod bound to the node, then
  Running (KWOK plays the kubelet); each timed on arrival, so both legs see the same delays;
* the operator's own figure, ``status.reclamations[].secondsToRunning`` (the pod's startTime,
  whole seconds, minus the action's time);
* writes: from the operator's cycle log lines ("N actions, M writes"), the acting cycle's writes
  (owner record + /scale + events + status) and the writes of the whole run (the idle pod's
  state, GPUIdle, the warning, the reclaim).

Prints one line per run and min / median / max; writes bench/results/reclaim-latency-<stamp>.json.
No timed assertions: exits non-zero only when a run never reclaims or the pod never runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency_sim.runner import RunOptions, ScenarioRun
from gpu_efficiency_sim.scenario import parse_scenario
from scale.run import install_crd_and_rbac, machine, running_cluster

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "hack" / "localcluster" / "cluster.sh"
OPERATOR_NAMESPACE = "gpu-efficiency-system"
POLICY = "reclaim-latency"
SCENARIO = f"""
name: reclaim-latency
nodes:
  - {{name: latency-gpu-0, gpus: 1, model: NVIDIA-H100-80GB-HBM3}}
workloads:
  - {{name: notebook, namespace: sim-latency, kind: Deployment, gpus: 1, profile: idle, terminationGracePeriodSeconds: 2}}
policies:
  {POLICY}:
    mode: Enforce
    interval: 5s
    window: 10s
    metrics: {{prometheus: {{scrapeInterval: 1s}}}}
    idle: {{idleFor: 5s, warningPeriod: 5s}}
expectations:
  - workloadObject: {{workload: notebook, field: spec.replicas, equals: 0}}
    within: 120s
"""
CYCLE_LINE = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:,]+)\].*policy " + POLICY + r": cycle [\d.]+s, \d+ verdicts, "
    r"(?P<actions>\d+) actions, (?P<writes>\d+) writes"
)


def log(message: str) -> None:
    print(f"[reclaim-latency {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cycles(log_path: Path) -> list[tuple[float, int, int]]:
    """(time, actions, writes) of each cycle the operator logged."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        m = CYCLE_LINE.match(line)
        if m:
            at = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, int(m["actions"]), int(m["writes"])))
    return out


def waiting_pod(name: str, node: str, scenario: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [
                {
                    "key": "sim.gpuefficiency.io/scenario",
                    "operator": "Equal",
                    "value": scenario,
                    "effect": "NoSchedule",
                }
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def watch_deployment(apps: client.AppsV1Api, namespace: str, seen: dict[str, float]) -> None:
    """``seen['action']``: when the watch event showing the Deployment at 0 replicas arrived."""
    stream = watch.Watch()
    for event in stream.stream(
        apps.list_namespaced_deployment,
        namespace,
        field_selector="metadata.name=notebook",
        timeout_seconds=240,
    ):
        if event["object"].spec.replicas == 0:
            seen["action"] = time.monotonic()
            stream.stop()


def watch_pod(core: client.CoreV1Api, name: str, seen: dict[str, float]) -> None:
    """``seen['scheduled']`` and ``seen['running']``: when the waiting pod's watch events showing it
    bound, then Running, arrived."""
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod, "default", field_selector=f"metadata.name={name}", timeout_seconds=240
    ):
        pod = event["object"]
        if pod.spec.node_name:
            seen.setdefault("scheduled", time.monotonic())
        if pod.status.phase == "Running":
            seen["running"] = time.monotonic()
            stream.stop()


def one_run(index: int, cluster: Any, operator_kubeconfig: str, workdir: Path) -> dict[str, Any]:
    core = client.CoreV1Api(cluster.api)
    apps = client.AppsV1Api(cluster.api)
    custom = client.CustomObjectsApi(cluster.api)
    measured = threading.Event()
    lines: list[str] = []
    command = (
        f"{sys.executable} -m gpu_efficiency.cli run --prometheus-url {cluster.prometheus_url} "
        f"--namespace {OPERATOR_NAMESPACE} --metrics-port 0 --health-port 0"
    )
    run = ScenarioRun(
        parse_scenario(SCENARIO),
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=cluster.prometheus_url,
            targets_dir=cluster.state_dir / "prometheus" / "targets",
            operator_cmd=command,
            operator_env={"KUBECONFIG": operator_kubeconfig},
            namespace_prefix=f"lat{index}-",
            log_dir=workdir,
            output=lines.append,
            before_teardown=lambda: measured.wait(180),
        ),
    )
    thread = threading.Thread(target=run.run, daemon=True)
    thread.start()
    name = f"reclaim-latency-waiting-{index}"
    out: dict[str, Any] = {"run": index}
    action_wall = 0.0
    try:
        deadline = time.monotonic() + 300
        while run.sim is None or not any(" t=0, " in line for line in lines):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the scenario did not start:\n" + "\n".join(lines))
            time.sleep(0.2)
        ns, _ = run.names.workloads["notebook"]
        node = run.names.nodes["latency-gpu-0"]

        def notebook_running() -> bool:
            pods = core.list_namespaced_pod(ns).items
            return any(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in pods)

        while not notebook_running():
            time.sleep(0.2)
        seen: dict[str, float] = {}
        watchers = [
            threading.Thread(target=watch_deployment, args=(apps, ns, seen), daemon=True),
            threading.Thread(target=watch_pod, args=(core, name, seen), daemon=True),
        ]
        for w in watchers:
            w.start()
        core.create_namespaced_pod("default", waiting_pod(name, node, run.name))
        for w in watchers:
            w.join(max(1.0, deadline - time.monotonic()))
        t_action, t_scheduled, t_running = (seen.get(k) for k in ("action", "scheduled", "running"))
        if t_action is None or t_running is None or t_scheduled is None:
            raise RuntimeError(f"run {index}: no reclaim or the waiting pod never ran")
        action_wall = time.time() - (time.monotonic() - t_action)
        if t_scheduled < t_action:
            raise RuntimeError(f"run {index}: the waiting pod was bound before the reclaim")
        seconds = None
        for _ in range(40):  # the operator's own figure, written by a later cycle
            status: Any = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, POLICY)
            records = (status.get("status") or {}).get("reclamations") or []
            seconds = next(
                (r.get("secondsToRunning") for r in records if r.get("secondsToRunning") is not None), None
            )
            if seconds is not None:
                break
            time.sleep(0.5)
        out |= {
            "action_to_scheduled_s": round(t_scheduled - t_action, 2),
            "action_to_running_s": round(t_running - t_action, 2),
            "operator_seconds_to_running": seconds,
        }
    finally:
        measured.set()
        thread.join(300)
        try:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
    logged = cycles(run.result.operator_log) if run.result.operator_log else []
    acting = [c for c in logged if c[1] > 0 and abs(c[0] - action_wall) < 3]
    out["acting_cycle_writes"] = acting[0][2] if acting else None
    out["run_writes"] = sum(c[2] for c in logged)
    out["passed"] = run.result.passed
    return out


def summary(values: list[float]) -> str:
    return f"min {min(values):.2f} / median {statistics.median(values):.2f} / max {max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    state = Path(env.get("GPUEFF_STATE_DIR", "/tmp/gpueff-localcluster"))
    if state == Path("/tmp/gpueff-localcluster"):
        raise SystemExit("refusing to use the default local cluster's state dir: set GPUEFF_STATE_DIR")
    if subprocess.run([str(CLUSTER_SH), "status"], env=env, capture_output=True).returncode != 0:
        log(f"starting the local cluster in {state}")
        subprocess.run([str(CLUSTER_SH), "up", "--nodes", "0"], env=env, check=True, capture_output=True)
    cluster = running_cluster(env, state)
    workdir = ROOT / "bench" / "results" / f"reclaim-latency-{time.strftime('%Y%m%d-%H%M%S')}"
    workdir.mkdir(parents=True, exist_ok=True)
    operator_kubeconfig = install_crd_and_rbac(cluster, workdir)
    results = []
    for index in range(args.runs):
        result = one_run(index, cluster, operator_kubeconfig, workdir)
        log(json.dumps(result))
        results.append(result)
    to_running = [r["action_to_running_s"] for r in results]
    to_scheduled = [r["action_to_scheduled_s"] for r in results]
    acting = [r["acting_cycle_writes"] for r in results if r["acting_cycle_writes"] is not None]
    print(f"runs: {len(results)}")
    print(f"reclaim -> waiting pod scheduled (s): {summary(to_scheduled)}")
    print(f"reclaim -> waiting pod Running (s):   {summary(to_running)}")
    print(f"operator secondsToRunning: {[r['operator_seconds_to_running'] for r in results]}")
    print(
        f"writes of the acting cycle: {acting}; writes of a whole run: {[r['run_writes'] for r in results]}"
    )
    (workdir / "results.json").write_text(json.dumps({"machine": machine(), "runs": results}, indent=2))
    print(f"results: {workdir / 'results.json'}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
