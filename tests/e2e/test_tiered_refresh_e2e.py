"""The idle scenarios pass unchanged with the tiered activity refresh at its smallest budget.

With ``--prometheus-refresh-budget 1`` the operator reuses cached activity windows of busy GPUs;
idleness, GPUActiveAgain (a pod that wakes up during its warning) and the eviction must keep the
scenarios' deadlines, since idle and idle-again GPUs are always fetched fresh. idle-reclaim has
mostly idle GPUs (its windows are fetched over every GPU); tiered/idle-among-busy is idle-activity
beside 12 busy GPUs, whose windows are carried and refreshed one a cycle, after it, in the
background.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from gpu_efficiency_sim.runner import RunOptions, run_scenario
from gpu_efficiency_sim.scenario import load_scenario
from tests.e2e.harness import Cluster, OperatorIdentity

pytestmark = pytest.mark.e2e

SCENARIOS = Path(__file__).parent / "scenarios"


@pytest.mark.parametrize(
    ("name", "carries"), [("idle-reclaim.yaml", False), ("tiered/idle-among-busy.yaml", True)]
)
def test_idle_scenarios_pass_with_a_tiny_refresh_budget(
    name: str, carries: bool, cluster: Cluster, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    scenario = load_scenario(SCENARIOS / name).scenario
    lines: list[str] = []
    result = run_scenario(
        SCENARIOS / name,
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
    assert result.passed, "\n".join(lines) + "\n----- operator log (tail) -----\n" + log[-4000:]
    assert len(result.outcomes) == len(scenario.expectations)
    carried = [int(n) for n in re.findall(r"activity window: .* (\d+) carried", log)]
    assert carried, "the tiered path did not run"
    if carries:
        assert max(carried) >= 8, carried  # most busy GPUs' windows were reused
        # and after cycles, the budget's one least recently refreshed GPU in the background (rule 4)
        refreshed = [int(n) for n in re.findall(r"refreshed (\d+) of 1 cached activity windows", log)]
        assert refreshed.count(1) >= 2, refreshed
