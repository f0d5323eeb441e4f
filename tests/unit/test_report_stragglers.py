"""report and explain show job groups and their stragglers: judged or why not, slower now or reported."""

from __future__ import annotations

from typing import Any

from gpu_efficiency.engine.planner import explain_pod, plan_cycle
from gpu_efficiency.report import build_report, render_table
from tests.unit.engine import builders as b
from tests.unit.engine.stragglers.test_outliers import job, run, slowed, snap, spec, trainer

THROTTLED: dict[str, Any] = {"clock": 1200.0, "CLOCK_EVENTS": b.stats(0x24, 0x64)}


def test_report_lists_groups_judged_or_not_and_the_straggler_with_its_cause() -> None:
    gpus, pods = job(slowed(**THROTTLED))
    small_gpus, small_pods = job(
        [trainer(), trainer()], prefix="pair", labels={"batch.kubernetes.io/job-name": "pair"}
    )
    snapshot = b.snapshot([*gpus, *small_gpus], [*pods, *small_pods], spec())
    first = build_report(snapshot, plan_cycle(snapshot))
    groups = {g["group"]: g for g in first["stragglerGroups"]}
    assert groups["job/pair"]["judged"] is False
    assert "fewer than minGpus" in groups["job/pair"]["why"]
    train = groups["job/train"]
    assert (train["pods"], train["gpus"], train["judged"]) == (8, 8, True)
    assert len(train["slower"]) == 1
    assert train["reported"] == []  # slow now, not yet for forDuration
    assert "cause: thermal slowdown" in train["slower"][0]
    table = render_table(first)
    assert "slower now (not yet for forDuration): team-a/train-3 on node node-3 GPU 0" in table
    assert "no: 2 GPUs, fewer than minGpus 4" in table

    later, plan = run(snap(slowed(**THROTTLED)), 3)
    (group,) = build_report(later, plan)["stragglerGroups"]
    assert group["reported"] == group["slower"]


def test_explain_shows_the_pods_group_and_its_straggler() -> None:
    snapshot = snap(slowed(**THROTTLED))
    lines = explain_pod(snapshot, "team-a", "train-0")
    start = next(i for i, line in enumerate(lines) if line.startswith("straggler group job/train"))
    assert lines[start] == "straggler group job/train: 8 pods, 8 GPUs, judged"
    assert lines[start + 1].startswith("  slower now, not yet for forDuration: team-a/train-3 on node node-3")
    quiet = explain_pod(snap([trainer() for _ in range(8)]), "team-a", "train-0")
    assert "  no GPU is slower than the group's median" in quiet
    off = explain_pod(b.snapshot(*job([trainer() for _ in range(8)]), b.policy()), "team-a", "train-0")
    assert not any(line.startswith("straggler group") for line in off)
