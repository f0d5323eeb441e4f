"""A restart is not a relabelling (issue 35.6): an operator process started on a cluster whose pods
already carry its annotations plans no write and no event for pods whose values did not move.

A restarted process has no judge memo and no idle ledger (the clocks it wrote): only the pods'
annotations. The cluster here has every kind of pod the steady state holds: efficient,
underutilized (each diagnosis), idle (Observe, and Enforce: idle clock running, warned, held by
budget), Unknown (a GPU without data), and pods that became active again. The first process runs
cycles with its memo and ledger until the cluster is settled; a new process then plans one cycle, which must write what the first
process would write in that cycle (nothing, once settled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tests.unit.engine import builders as b

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, GPUSample, PodEvent, PodView, Snapshot, Stats
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger
from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo

PROFILES: dict[str, Callable[[], Any]] = {
    "compute": b.compute_bound,
    "idle": b.idle,
    "idle-mem": b.idle_holding_memory,
    "fake": b.fake_load,
    "memory": b.memory_bound,
    "input": b.input_starved,
    "comm": b.communication_bound,
    "occupancy": b.low_occupancy,
    "tensor": b.no_tensor_cores,
    "thermal": b.thermal_throttled,
    "bursty": b.bursty_inference,
}


def cluster() -> tuple[list[GPUSample], list[PodView]]:
    gpus: list[GPUSample] = []
    pods: list[PodView] = []
    for i, (name, profile) in enumerate(sorted(PROFILES.items())):
        for copy in range(2):
            pod_name = f"{name}-{copy}"
            node = f"node-{i % 3}"
            gpus.append(b.gpu(f"GPU-{i:02d}{copy}", profile(), ("team-a", pod_name), node=node))
            pods.append(b.pod(pod_name, node=node))
    no_data: dict[Any, Stats] = {}
    gpus.append(b.gpu("GPU-nodata", no_data, ("team-a", "unknown-0")))
    pods.append(b.pod("unknown-0"))
    return gpus, pods


def writes(snap: Snapshot, memo: JudgeMemo | None, ledger: IdleLedger | None) -> list[str]:
    """The plan's pod writes and events, evictions included, as comparable lines."""
    plan = plan_cycle(snap, memo, ledger)
    return [
        f"{type(a).__name__} {getattr(a, 'name', '')} {getattr(a, 'annotations', getattr(a, 'reason', ''))}"
        for a in plan.actions
        if isinstance(a, AnnotatePod | PodEvent | EvictPod)
    ]


WARNED = {"idle_for": "1m", "warning_period": "1h"}


@pytest.mark.parametrize(
    ("spec", "settled"),
    [
        (b.policy(), True),  # Observe: annotations and idle clocks
        (b.enforce(idle=WARNED), True),  # idle pods warned, evict-after an hour away
        (b.enforce(idle={"idle_for": "1h", "warning_period": "1h"}), True),  # idle clocks running
        # evicting one idle pod a cycle (the budget): the restart makes the same writes, no more
        (b.enforce(idle={"idle_for": "1m", "warning_period": "2m"}, eviction={"max_per_cycle": 1}), False),
    ],
    ids=["observe", "enforce-warned", "enforce-clock-running", "enforce-evicting"],
)
def test_a_restarted_operator_writes_only_what_the_running_one_would(spec: Any, settled: bool) -> None:
    gpus, pods = cluster()
    snap = b.snapshot(gpus, pods, spec)
    memo, ledger = JudgeMemo(), IdleLedger()
    for _ in range(6):  # the first process: labels, starts idle clocks, warns, evicts, a minute apart
        plan = plan_cycle(snap, memo, ledger)
        snap = b.apply_plan(snap, plan, advance=60.0)
    assert any(p.annotations for p in snap.pods)
    running = writes(snap, memo, ledger)  # what the process that kept running does now
    restarted = writes(snap, JudgeMemo(), IdleLedger())  # a new process's first cycle
    cold = writes(snap, None, None)  # without memo or ledger at all
    assert restarted == running
    assert cold == running
    if settled:
        assert running == []


def test_the_cluster_holds_warned_and_clocked_pods_at_the_restart() -> None:
    """The restart above meets every lifecycle annotation it must leave alone."""
    gpus, pods = cluster()
    snap = b.snapshot(gpus, pods, b.enforce(idle=WARNED))
    for _ in range(6):
        snap = b.apply_plan(snap, plan_cycle(snap), advance=60.0)
    keys = {key for p in snap.pods for key in p.annotations}
    assert {names.IDLE_SINCE, names.EVICT_AFTER, names.STATE, names.DIAGNOSIS, names.EFFICIENCY} <= keys
