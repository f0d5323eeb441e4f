"""Enforce is described as what it does by default (owners reclaimed by kind), not as "evict idle
pods": an admin who believes eviction is harmless would find Deployments at zero replicas."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.api.policy.reclaim import OwnerActions
from tests.unit.user_docs import POLICY_REFERENCE, README, USER_DOCS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-efficiency-operator"
#: What the Enforce tables (README, docs/policies.md) say for each default action.
WORDS = {
    ReclaimAction.SCALE_TO_ZERO: "scaled to 0 replicas",
    ReclaimAction.SUSPEND: "suspended",
    ReclaimAction.STOP: "stopped",
    ReclaimAction.RECOMMEND: "nothing: a recommendation",
}


@pytest.mark.parametrize(
    "path",
    [
        *USER_DOCS,
        CHART / "templates" / "NOTES.txt",
        CHART / "values.yaml",
        CHART / "values.schema.json",
    ],
)
def test_enforce_is_never_described_as_evicting_idle_pods(path: Path) -> None:
    text = " ".join(path.read_text().split())
    assert not re.search(r"Enforce[^.]{0,40}\bevict(s)? idle pods", text), path.name
    assert not re.search(r"Enforce \(also evict", text), path.name


@pytest.mark.parametrize("readme", [README, POLICY_REFERENCE], ids=lambda p: p.name)
def test_the_readme_enforce_table_matches_the_default_actions(readme: Path) -> None:
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in readme.read_text().splitlines()
        if line.startswith("| ") and line.count("|") == 4
    }
    defaults = OwnerActions()
    for owner_cell, kinds in (
        ("Deployment, StatefulSet", ("Deployment", "StatefulSet")),
        ("Job, JobSet", ("Job", "JobSet")),
        ("Kubeflow Notebook", ("Notebook",)),
        (
            "LeaderWorkerSet, KServe InferenceService, owner only partly idle",
            ("LeaderWorkerSet", "InferenceService"),
        ),
    ):
        for kind in kinds:
            assert rows[owner_cell].startswith(WORDS[defaults.for_kind(kind)]), (owner_cell, kind)
    assert defaults.for_kind("Pod") is ReclaimAction.EVICT
    assert "only with `eviction.allowBarePods: true`" in rows["bare pod (no controller)"]


def test_the_chart_notes_say_what_enforce_reclaims() -> None:
    notes = " ".join((CHART / "templates" / "NOTES.txt").read_text().split())
    for words in (
        "scaled to zero",
        "Jobs and JobSets suspended",
        "Notebooks stopped",
        "gpu-efficiency restore",
    ):
        assert words in notes, words
