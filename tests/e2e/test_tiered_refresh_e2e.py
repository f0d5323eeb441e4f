"""The idle scenarios pass unchanged with the tiered activity refresh at its smallest budget.

With ``--prometheus-refresh-budget 1`` the operator reuses cached activity windows of busy GPUs;
idleness, GPUActiveAgain (a pod that wakes up during its warning) and the eviction must keep the
scenarios' deadlines, since idle and idle-again GPUs are always fetched fresh. idle-reclaim has
mostly idle GPUs (its windows are fetched over every GPU); tiered/idle-among-busy is idle-activity
beside 12 busy GPUs, whose windows are carried and refreshed one a cycle, after it, in the
background. The two are played side by side in one run, one operator (``make test`` budget: one
run's length instead of two), each copied the way the generation matrix copies a scenario (its own
names, its policies selecting only its own nodes and namespaces), with every expectation kept.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency_sim.runner import RunOptions, run_scenario
from gpu_efficiency_sim.scenario import load_scenario
from tests.e2e.harness import Cluster, OperatorIdentity
from tests.e2e.scenario_driver import scenario_report
from tests.e2e.test_generations_e2e import copy_scenario, shared

pytestmark = pytest.mark.e2e

SCENARIOS: Final = Path(__file__).parent / "scenarios"
#: Copy tag -> the scenario file played under it.
SOURCES: Final = {"tr": "idle-reclaim.yaml", "tb": "tiered/idle-among-busy.yaml"}


def side_by_side() -> dict[str, Any]:
    """Both idle scenarios as one, on the simulator's default generation (the files as written)."""
    merged: dict[str, Any] = {
        "name": "tiered-refresh",
        "description": "idle-reclaim and idle-among-busy side by side under a refresh budget of 1.",
        "nodes": [],
        "namespaces": {},
        "workloads": [],
        "faults": [],
        "policies": {},
        "expectations": [],
    }
    for tag, name in SOURCES.items():
        source = yaml.safe_load((SCENARIOS / name).read_text())
        policies = shared(source, [tag])
        for spec in policies["policies"].values():  # type: ignore[union-attr]
            # The scheduler puts either file's pods on any of the run's nodes; the files' policies
            # select every node, so each keeps to its own file's namespaces only.
            del spec["selection"]["nodeSelector"]
        for part in (copy_scenario(source, tag, (Generation.V4,)), policies):
            for key, value in part.items():
                if isinstance(value, list):
                    merged[key].extend(value)
                else:
                    merged[key].update(value)
    return merged


def test_the_side_by_side_scenario_keeps_every_expectation_of_both(tmp_path: Path) -> None:
    path = tmp_path / "tiered.yaml"
    path.write_text(yaml.safe_dump(side_by_side(), sort_keys=False))
    scenario = load_scenario(path).scenario
    sources = [load_scenario(SCENARIOS / name).scenario for name in SOURCES.values()]
    assert len(scenario.expectations) == sum(len(s.expectations) for s in sources)
    assert set(scenario.policies) == {p for s in sources for p in s.policies}
    assert all("nodeSelector" not in p["selection"] for p in side_by_side()["policies"].values())


def test_idle_scenarios_pass_with_a_tiny_refresh_budget(
    cluster: Cluster, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    path = tmp_path / "tiered.yaml"
    path.write_text(yaml.safe_dump(side_by_side(), sort_keys=False))
    scenario = load_scenario(path).scenario
    lines: list[str] = []
    result = run_scenario(
        path,
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=cluster.prometheus_url,
            targets_dir=cluster.prometheus_targets_dir(),
            operator=True,
            operator_cmd=operator_identity.run_command(
                cluster, "--prometheus-refresh-budget 1 --log-level DEBUG"
            ),
            operator_env={"KUBECONFIG": operator_identity.kubeconfig},
            namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
            log_dir=tmp_path,
            output=lines.append,
        ),
    )
    log = result.operator_log.read_text(errors="replace") if result.operator_log else ""
    assert result.passed, scenario_report(lines, result)
    assert len(result.outcomes) == len(scenario.expectations)
    carried = [int(n) for n in re.findall(r"activity window: .* (\d+) carried", log)]
    assert carried, "the tiered path did not run"
    assert max(carried) >= 8, carried  # most busy GPUs' windows were reused
    # and after cycles, the budget's one least recently refreshed GPU in the background (rule 4)
    refreshed = [int(n) for n in re.findall(r"refreshed (\d+) of 1 cached activity windows", log)]
    assert refreshed.count(1) >= 2, refreshed
