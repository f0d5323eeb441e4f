"""`gpu-efficiency-sim run` over the shipped scenarios, and its failure paths.

Each shipped scenario runs with the operator as a separate process holding the chart's RBAC (the
operator_identity fixture's ServiceAccount kubeconfig); scenarios with needsOperator: false run
without it. The core scenarios (``CORE``: diagnoses, ECC, XID/thermal, idle-reclaim) are played by
test_generations_e2e.py instead, whose 4.x copy of each is the file as written (its PromQL ``metric``
expectations included) beside its copies on the other exporter generations: one scenario run for
all of them rather than two (``make test`` budget).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from gpu_efficiency_sim.runner import RunOptions, run_scenario
from gpu_efficiency_sim.scenario import load_scenario
from tests.e2e.harness import Cluster, OperatorIdentity
from tests.e2e.scenario_driver import scenario_report
from tests.e2e.test_generations_e2e import CORE

pytestmark = pytest.mark.e2e

SCENARIOS = Path(__file__).parent / "scenarios"
HARNESS = Path(__file__).resolve().parents[2] / "harness"
SHIPPED = sorted(p.name for p in SCENARIOS.glob("*.yaml"))
PLAYED_HERE = [name for name in SHIPPED if name not in CORE]


def sim_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "GPUEFF_PROMETHEUS_URL": cluster.prometheus_url}
    # The harness package runs from this checkout even where the venv has not installed it yet.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HARNESS), os.environ.get("PYTHONPATH"))))
    targets = cluster.prometheus_targets_dir()
    if targets is not None:
        env["GPUEFF_PROMETHEUS_TARGETS_DIR"] = str(targets)
    return subprocess.run(
        [sys.executable, "-m", "gpu_efficiency_sim", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_every_core_scenario_left_to_the_generation_matrix_is_shipped() -> None:
    """A core file renamed or removed would otherwise drop out of both runs without a failure."""
    assert set(CORE) <= set(SHIPPED), sorted(set(CORE) - set(SHIPPED))


@pytest.mark.parametrize("name", PLAYED_HERE)
def test_shipped_scenario_passes(
    name: str, cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    scenario = load_scenario(SCENARIOS / name).scenario
    operator_cmd, operator_env = "", {}
    if scenario.needs_operator:
        identity: OperatorIdentity = request.getfixturevalue("operator_identity")
        operator_cmd = identity.run_command(cluster)
        operator_env = {"KUBECONFIG": identity.kubeconfig}
    lines: list[str] = []
    result = run_scenario(
        SCENARIOS / name,
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=cluster.prometheus_url,
            targets_dir=cluster.prometheus_targets_dir(),
            operator=scenario.needs_operator,
            operator_cmd=operator_cmd,
            operator_env=operator_env,
            namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
            log_dir=tmp_path,
            output=lines.append,
        ),
    )
    assert result.passed, scenario_report(lines, result)
    assert len(result.outcomes) == len(scenario.expectations)


def test_a_false_expectation_fails_the_run_with_what_was_observed(
    cluster: Cluster, k8s: client.ApiClient
) -> None:
    proc = sim_cli(cluster, "run", str(SCENARIOS / "bad" / "false-expectation.yaml"), "--no-operator")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  [" in proc.stdout
    assert "a healthy node gets tainted (impossible): taints: none" in proc.stdout
    assert "FAILED: 0/1 expectations passed" in proc.stdout
    names = [n.metadata.name for n in client.CoreV1Api(k8s).list_node().items]
    assert "false-gpu-0" not in names, "the run cleans up its node"
    targets = cluster.prometheus_targets_dir()
    if targets is not None:
        assert not list(targets.glob("sim-false-expectation-*.json")), "the run unregisters its target"


def test_a_malformed_scenario_exits_2_naming_the_file_and_each_problem(
    cluster: Cluster, k8s: client.ApiClient
) -> None:
    proc = sim_cli(cluster, "run", str(SCENARIOS / "bad" / "malformed.yaml"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "malformed.yaml: invalid scenario" in proc.stderr
    for problem in (
        "workloads[0].profile (line 11)",
        "faults[0].at (line 14)",
        "expectations[0].colour (line 20)",
    ):
        assert problem in proc.stderr
    names = [n.metadata.name for n in client.CoreV1Api(k8s).list_node().items]
    assert "bad-gpu-0" not in names, "nothing is created from an invalid file"
