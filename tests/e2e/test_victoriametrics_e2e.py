"""The core scenarios on VictoriaMetrics, single-node and cluster, and one vmstorage of two down.

The operator sends plain Prometheus HTTP API queries, so a PromQL store other than Prometheus must
give it the same answers: the diagnosis, ECC, XID/thermal and idle-reclaim scenarios
(``tests/e2e/scenarios/``) are played unchanged with the operator pointed at VictoriaMetrics
(``cluster.sh victoriametrics-up``: it scrapes the same file-SD targets as the session cluster's
Prometheus, beside it, so the control plane is shared), and must pass as they do on Prometheus.

The cluster version (vminsert, two vmstorage, vmselect, fed by vmagent) is not served by the Go
module proxy, so ``build-victoriametrics.sh`` cannot build it: its tests run where
``GPUEFF_VM_CLUSTER_BIN`` names its binaries and are skipped, saying so, elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client

from gpu_efficiency.api import names
from gpu_efficiency_sim.runner import RunOptions, run_scenario
from tests.e2e import test_operator as op
from tests.e2e.harness import CLUSTER_SH, Cluster, OperatorIdentity, OperatorProcess, wait_for
from tests.e2e.scenario_driver import scenario_report
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_operator import policies  # noqa: F401

pytestmark = pytest.mark.e2e

SCENARIOS: Final = Path(__file__).parent / "scenarios"
#: The scenarios the backend matrix plays (as the exporter matrix does).
CORE: Final = ("diagnoses.yaml", "ecc-fault.yaml", "xid-thermal.yaml", "idle-reclaim.yaml")
#: The vmstorage outage of the chaos case.
OUTAGE_S: Final = 20


def _cluster_sh(cluster: Cluster, *args: str, timeout: float = 300) -> str:
    if cluster.state_dir is None:
        pytest.skip("GPUEFF_USE_EXISTING_CLUSTER: VictoriaMetrics is started by the local cluster only")
    env = {**os.environ, "GPUEFF_STATE_DIR": str(cluster.state_dir)}
    done = subprocess.run(
        [str(CLUSTER_SH), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cluster.sh {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def _answer(url: str, query: str) -> dict[str, Any]:
    """VictoriaMetrics' whole answer to an instant query (``isPartial`` included)."""
    body = urllib.parse.urlencode({"query": query}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def _pod_annotations(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    meta = core.read_namespaced_pod(name, namespace).metadata
    return dict((meta.annotations if meta else None) or {})


@pytest.fixture(scope="module")
def victoriametrics(cluster: Cluster) -> Iterator[str]:
    """VictoriaMetrics single-node beside the session cluster's Prometheus: its query URL."""
    url = _cluster_sh(cluster, "victoriametrics-up", timeout=3600)  # first use builds it
    yield url
    _cluster_sh(cluster, "victoriametrics-down")


@pytest.fixture(scope="module")
def victoriametrics_cluster(cluster: Cluster) -> Iterator[str]:
    """vminsert, two vmstorage and vmselect (fed by vmagent) beside the session cluster's Prometheus."""
    if not os.environ.get("GPUEFF_VM_CLUSTER_BIN"):
        pytest.skip(
            "GPUEFF_VM_CLUSTER_BIN is not set: VictoriaMetrics' cluster version (its -cluster tags) is not "
            "served by the Go module proxy, so build-victoriametrics.sh cannot build it (hack/localcluster/README.md)"
        )
    url = _cluster_sh(cluster, "victoriametrics-up", "--cluster", timeout=3600)
    yield url
    _cluster_sh(cluster, "victoriametrics-down")


def _play(name: str, url: str, cluster: Cluster, identity: OperatorIdentity, tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_scenario(
        SCENARIOS / name,
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=url,
            targets_dir=cluster.prometheus_targets_dir(),
            operator_cmd=identity.run_command(cluster, "--prometheus-url", url),  # the last one counts
            operator_env={"KUBECONFIG": identity.kubeconfig},
            namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
            log_dir=tmp_path,
            output=lines.append,
        ),
    )
    assert result.passed, scenario_report(lines, result)


@pytest.mark.parametrize("name", CORE)
def test_core_scenarios_on_victoriametrics(
    name: str, victoriametrics: str, cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _play(name, victoriametrics, cluster, request.getfixturevalue("operator_identity"), tmp_path)


def test_the_tiered_refresh_on_victoriametrics(
    victoriametrics: str, cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The tiered activity refresh (``--prometheus-refresh-budget``) at VictoriaMetrics' default
    ``-search.maxQueryLen`` (16 KiB): idle-among-busy passes with busy GPUs' windows carried and
    the budget's bucket refreshed in the background, and no query is refused for its length (its
    listed queries were ~3 KB per GPU over the limit before they were cut to fit)."""
    identity = request.getfixturevalue("operator_identity")
    lines: list[str] = []
    result = run_scenario(
        SCENARIOS / "tiered" / "idle-among-busy.yaml",
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=victoriametrics,
            targets_dir=cluster.prometheus_targets_dir(),
            operator_cmd=identity.run_command(
                cluster,
                "--prometheus-url",
                victoriametrics,
                "--prometheus-refresh-budget 1 --log-level DEBUG",
            ),
            operator_env={"KUBECONFIG": identity.kubeconfig},
            namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
            log_dir=tmp_path,
            output=lines.append,
        ),
    )
    log = result.operator_log.read_text(errors="replace") if result.operator_log else ""
    assert result.passed, scenario_report(lines, result)
    assert "maxQueryLen" not in log
    assert "too long" not in log
    carried = [int(n) for n in re.findall(r"activity window: .* (\d+) carried", log)]
    assert carried, "the tiered path did not run"
    assert max(carried) >= 8, carried  # most busy GPUs' windows were reused
    refreshed = [int(n) for n in re.findall(r"refreshed (\d+) of 1 cached activity windows", log)]
    assert refreshed.count(1) >= 2, refreshed  # rule 4's bucket, answered by VictoriaMetrics


@pytest.mark.parametrize("name", CORE)
def test_core_scenarios_on_victoriametrics_cluster(
    name: str, victoriametrics_cluster: str, cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _play(name, victoriametrics_cluster, cluster, request.getfixturevalue("operator_identity"), tmp_path)


def test_one_vmstorage_down_is_missing_data_never_an_action(
    k8s: client.ApiClient,
    victoriametrics_cluster: str,
    cluster: Cluster,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    operator_identity: OperatorIdentity,
    policies: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """vmselect answers from the vmstorage node it still reaches (``isPartial: true``): the operator
    must read that as no answer, so an idle pod past its warning is not evicted while one storage node
    of two is down, and is evicted once both answer again."""
    core = client.CoreV1Api(k8s)
    client.AppsV1Api(k8s).create_namespaced_deployment(
        namespace, op.deployment(namespace, "notebook", "idle", gpu_nodes)
    )
    name = op.create_policy(
        k8s,
        policies,
        op.policy_body(
            f"vmpartial-{uuid.uuid4().hex[:6]}",
            namespace,
            mode="Enforce",
            idle={"idleFor": "3s", "warningPeriod": "15s"},
        ),
    )
    operator = OperatorProcess(
        identity=operator_identity, prometheus_url=victoriametrics_cluster, log_dir=tmp_path
    )
    operator.start()
    try:
        pod = wait_for(lambda: op.running_pod(core, namespace, "notebook"), 60, what="notebook running")
        pod_name = str(pod.metadata.name) if pod.metadata else ""
        wait_for(
            lambda: _pod_annotations(core, namespace, pod_name).get(names.EVICT_AFTER), 90, what="the warning"
        )
        _cluster_sh(cluster, "vmstorage-down", "1")
        try:
            # The outage is a partial answer, not an error: what the operator must not act on.
            assert _answer(victoriametrics_cluster, "count(up)").get("isPartial") is True
            t0 = time.monotonic()
            cond = wait_for(
                lambda: (c := op.condition(k8s, name, names.COND_METRICS)) and c["status"] == "False" and c,
                15,
                what="MetricsAvailable=False on a partial answer",
            )
            assert "partial" in cond["message"], cond
            assert op.policy_events(k8s, name, names.EV_METRICS_UNAVAILABLE) >= 1
            # The warning's deadline passes while the answers are partial: no eviction, warning kept.
            while time.monotonic() - t0 < OUTAGE_S:
                assert not op.gone_or_terminating(core, namespace, pod_name), "evicted on a partial answer"
                time.sleep(1)
            assert _pod_annotations(core, namespace, pod_name).get(names.EVICT_AFTER), (
                "the warning was dropped"
            )
        finally:
            _cluster_sh(cluster, "vmstorage-up", "1")
        wait_for(
            lambda: (c := op.condition(k8s, name, names.COND_METRICS)) and c["status"] == "True",
            60,
            what="MetricsAvailable=True again",
        )
        wait_for(
            lambda: op.gone_or_terminating(core, namespace, pod_name), 90, what="the eviction after recovery"
        )
    except BaseException:
        print(f"\n----- operator log (last 4000 chars) -----\n{operator.log()[-4000:]}")
        raise
    finally:
        operator.stop()
