"""bench/plan_replay.py: a saved cycle replays to the plan the engine made from it, and the digest
tells two plans apart (what the bench's "the same plan" across commits rests on)."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import ModuleType

import pytest

from gpu_efficiency import engine
from gpu_efficiency.engine.model import Signal, Snapshot, Stats, Verdict
from tests.unit.engine import builders as b
from tests.unit.test_bench_imports import BENCH, load_script


@pytest.fixture
def replay(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script(BENCH / "plan_replay.py", monkeypatch)


def cluster(profile_of_p1: dict[Signal, Stats]) -> Snapshot:
    gpus = [b.gpu("GPU-0", b.idle(), ("team-a", "p0")), b.gpu("GPU-1", profile_of_p1, ("team-a", "p1"))]
    return b.snapshot(gpus, [b.pod("p0"), b.pod("p1")], b.enforce())


def save(path: Path, snapshot: Snapshot, memory: engine.Memory) -> Path:
    with path.open("wb") as out:
        pickle.dump((snapshot, memory), out)
    return path


def test_a_saved_cycle_replays_to_the_plan_made_from_it(replay: ModuleType, tmp_path: Path) -> None:
    snap = cluster(b.compute_bound())
    saved = save(tmp_path / "plan-3.pkl", snap, engine.Memory())
    _, made = engine.plan(snap, engine.Memory())
    assert {v.name: v.verdict for v in made.verdicts} == {"p0": Verdict.IDLE, "p1": Verdict.EFFICIENT}

    result = replay.replay(saved, 3)
    assert (result["verdicts"], result["actions"]) == (2, len(made.actions))
    assert result["actions"] > 0  # first cycle: both pods are annotated
    assert result["judged"] == 0  # fresh windows (not carried) are never memoised
    assert 0 < result["min_s"] <= result["median_s"] <= result["max_s"]
    assert replay.replay(saved, 1)["digest"] == result["digest"]  # each repeat starts from the file


def test_the_digest_tells_two_plans_apart(replay: ModuleType, tmp_path: Path) -> None:
    busy = replay.replay(save(tmp_path / "a.pkl", cluster(b.compute_bound()), engine.Memory()), 1)
    idle = replay.replay(save(tmp_path / "b.pkl", cluster(b.idle()), engine.Memory()), 1)
    assert busy["digest"] != idle["digest"]
    assert busy["verdicts"] == idle["verdicts"] == 2
