"""bench/plan_replay.py: a saved cycle replays to the plan the engine made from it, and the digest
tells two plans apart (what the bench's "the same plan" across commits rests on)."""

from __future__ import annotations

import pickle
from dataclasses import replace
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


def test_steady_times_the_unchanged_cycle_after_the_saved_one(replay: ModuleType, tmp_path: Path) -> None:
    first = cluster(b.compute_bound())
    memory = engine.Memory()
    _, made = engine.plan(first, memory)
    after = b.apply_plan(first, made)  # annotated as the first plan asked; windows carried from here on
    snap = replace(after, gpus=tuple(replace(g, carried_newest=after.now - 10.0) for g in after.gpus))
    saved = save(tmp_path / "plan-2.pkl", snap, memory)
    steady = replay.replay(saved, 2, steady=True)
    assert (steady["kept"], steady["judged"], steady["quiet"]) == (2, 0, 1)  # p1 (Efficient) is quiet
    _, again = engine.plan(snap, engine.Memory())  # the same snapshot planned from scratch
    assert steady["digest"] == replay.digest(again)
    assert steady["verdicts"] == 2
