"""The node agent as a real process (fake NVML backend), and the operator judging pods from its data
alone: once through Prometheus scraping the agent, once reading the agent directly while Prometheus
is unreachable; and its faults reaching a taint through the agent's node condition, without a scrape
or a regular cycle. No simulator runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency_sim.targets import register, targets_dir, unregister
from tests.e2e.harness import Cluster, gpu_condition, wait_for
from tests.e2e.sim_fixtures import GPUNodes, gpu_nodes  # noqa: F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def notebook(k8s: client.ApiClient, namespace: str, gpu_nodes: GPUNodes) -> tuple[str, str]:  # noqa: F811
    """A bare GPU pod pinned to the first fake node: (namespace, name)."""
    key, _ = gpu_nodes.label
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="notebook"),
            spec=client.V1PodSpec(
                node_name=gpu_nodes.names[0],
                termination_grace_period_seconds=1,
                tolerations=[client.V1Toleration(key=key, operator="Exists", effect="NoSchedule")],
                containers=[
                    client.V1Container(
                        name="main",
                        image="registry.k8s.io/pause:3.10",
                        resources=client.V1ResourceRequirements(limits={names.GPU_RESOURCE: "1"}),
                    )
                ],
            ),
        ),
    )
    wait_for(
        lambda: core.read_namespaced_pod("notebook", namespace).status.phase == "Running",
        60,
        what="the notebook Running",
    )
    return namespace, "notebook"


@pytest.fixture
def agent(gpu_nodes: GPUNodes, notebook: tuple[str, str], tmp_path: Path) -> Iterator[str]:  # noqa: F811
    """`gpu-efficiency-sim agent` (fake NVML) on the notebook's node, its GPU 0 idle and attributed."""
    port = free_port()
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_efficiency_sim",
            "agent",
            "--fake-gpus",
            "4",
            "--fake-profile",
            "idle",
            "--node-name",
            gpu_nodes.names[0],
            "--interval",
            "1s",
            "--fake-pods",
            f"{notebook[0]}/{notebook[1]}=0",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, what="the agent ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _policy(k8s: client.ApiClient, namespace: str, node_agent: bool) -> str:
    name = f"agent-{uuid.uuid4().hex[:6]}"
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUEfficiencyPolicy",
            "metadata": {"name": name},
            "spec": {
                "interval": "3s",
                "window": "12s",
                "metrics": {"prometheus": {"scrapeInterval": "1s"}, "nodeAgent": node_agent},
                "selection": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
                "eviction": {"allowBarePods": True},
                "faults": {"enabled": False},
            },
        },
    )
    return name


def _judged_idle(core: client.CoreV1Api, namespace: str) -> dict[str, str] | None:
    ann = core.read_namespaced_pod("notebook", namespace).metadata.annotations or {}
    return dict(ann) if ann.get(names.STATE) == "Idle" else None


def _delete(k8s: client.ApiClient, name: str) -> None:
    client.CustomObjectsApi(k8s).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_operator_judges_from_the_agent_through_prometheus(
    cluster: Cluster, k8s: client.ApiClient, notebook: tuple[str, str], agent: str, start_operator: Any
) -> None:
    directory = cluster.prometheus_targets_dir() or Path(
        os.environ.get("GPUEFF_PROMETHEUS_TARGETS_DIR", targets_dir())
    )
    target = f"agent-{uuid.uuid4().hex[:6]}"
    path = register(
        target, [agent.removeprefix("http://")], directory=directory, labels={"job": "node-agent"}
    )
    name = _policy(k8s, notebook[0], node_agent=False)
    try:
        start_operator()
        ann = wait_for(
            lambda: _judged_idle(client.CoreV1Api(k8s), notebook[0]), 90, what="Idle from agent data"
        )
        assert "SM_ACTIVE" in ann[names.ACTIVITY_SIGNAL]  # GPM-style SM activity, not GPU util
    finally:
        unregister(path)
        _delete(k8s, name)


def test_operator_reads_the_agent_directly_when_prometheus_is_down(
    k8s: client.ApiClient, notebook: tuple[str, str], agent: str, start_operator: Any
) -> None:
    name = _policy(k8s, notebook[0], node_agent=True)
    try:
        start_operator("--prometheus-url", "http://127.0.0.1:9", "--agent-urls", agent)
        ann = wait_for(
            lambda: _judged_idle(client.CoreV1Api(k8s), notebook[0]), 90, what="Idle from the agent"
        )
        assert "SM_ACTIVE" in ann[names.ACTIVITY_SIGNAL]
        status = client.CustomObjectsApi(k8s).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)[
            "status"
        ]
        metrics_cond = next(c for c in status["conditions"] if c["type"] == names.COND_METRICS)
        assert metrics_cond["status"] == "True"
    finally:
        _delete(k8s, name)


@pytest.fixture
def fault_agent(cluster: Cluster, gpu_nodes: GPUNodes, tmp_path: Path) -> Iterator[tuple[str, Path]]:  # noqa: F811
    """An agent on the second fake node that writes its GPUHealthy condition; NVML events go in
    through its inbox: (URL, inbox). Prometheus does not scrape it."""
    port, inbox = free_port(), tmp_path / "inbox"
    inbox.mkdir()
    log = (tmp_path / "fault-agent.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpu_efficiency_sim", "agent",
            "--fake-gpus", "4", "--node-name", gpu_nodes.names[1], "--interval", "1s",
            "--listen", f"127.0.0.1:{port}", "--write-node-condition", "--fake-inbox", str(inbox),
        ],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, what="the fault agent ready")
        yield url, inbox
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _cycles(op: Any, policy: str) -> int:
    return int(op.log().count(f"policy {policy}: cycle "))


def _our_taint(core: client.CoreV1Api, node: str) -> str | None:
    taints = core.read_node(node).spec.taints or []
    return next((t.value for t in taints if t.key == names.FAULT_TAINT_KEY), None)


def test_an_agent_fault_taints_at_once_and_a_forged_condition_taints_nothing(
    k8s: client.ApiClient,
    gpu_nodes: GPUNodes,  # noqa: F811
    fault_agent: tuple[str, Path],
    start_operator: Any,
) -> None:
    """The policy's interval is 10 minutes and Prometheus has no series of the node: only the early
    cycle the agent's GPUHealthy=False wakes, reading the agent's snapshot, can taint within seconds.
    A GPUHealthy=False someone else writes with the agent's reason wakes a cycle too, which taints nothing."""
    url, inbox = fault_agent
    node, core = gpu_nodes.names[1], client.CoreV1Api(k8s)
    key, value = gpu_nodes.label
    name = f"agentfast-{uuid.uuid4().hex[:6]}"
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        GROUP, VERSION, PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUEfficiencyPolicy", "metadata": {"name": name},
            "spec": {
                "mode": "Enforce", "interval": "10m", "window": "10m",
                "metrics": {"prometheus": {"scrapeInterval": "1s"}, "nodeAgent": True},
                "selection": {"nodeSelector": {"matchLabels": {key: value}}},
                "faults": {"lookback": "30s", "xid": {"recovery": "Manual"}},
            },
        },
    )  # fmt: skip
    try:
        op = start_operator("--agent-urls", url)
        wait_for(lambda: _cycles(op, name) >= 1, 60, what="the policy's first cycle")
        time.sleep(25)  # the agent's history covers the lookback (minCoverage 0.6 of 30 s)
        before = _cycles(op, name)
        forged = {"type": names.GPU_HEALTHY, "status": "False", "reason": "XidCriticalError",
                  "message": "forged", "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
        core.patch_node_status(node, {"status": {"conditions": [forged]}})
        wait_for(lambda: _cycles(op, name) > before, 15, what="an early cycle woken by the forged condition")
        assert _our_taint(core, node) is None

        staged = inbox / "xid.tmp"
        staged.write_text(json.dumps({"gpu": 2, "event": "xid", "xid": 79}))
        injected = time.monotonic()
        staged.rename(inbox / "xid.json")
        wait_for(lambda: _our_taint(core, node), 15, what="the taint from the agent's XID")
        took = time.monotonic() - injected
        assert took < 10, f"tainted {took:.1f}s after the XID: not by an early cycle"
        assert "xid" in str(_our_taint(core, node))
        # The operator's reason, taken over from the agent's report: written after the taint, in the
        # same cycle, so it may land a moment after the taint is seen.
        wait_for(
            lambda: getattr(gpu_condition(core, node), "reason", None) == "GPUFaultXID",
            10,
            what="the operator's GPUHealthy reason",
        )
    finally:
        _delete(k8s, name)
