"""Every shipped sample policy is valid against the models (the CRD is generated from them)."""

from pathlib import Path

import pytest
import yaml

from gpu_efficiency.api.policy import GROUP, KIND, VERSION, GPUEfficiencyPolicySpec, Mode

SAMPLES = sorted((Path(__file__).resolve().parents[3] / "config" / "samples").glob("*.yaml"))


def test_there_are_samples() -> None:
    assert len(SAMPLES) >= 2


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_sample_is_valid(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}"
    assert doc["kind"] == KIND
    assert "namespace" not in doc["metadata"], "policies are cluster-scoped"
    spec = GPUEfficiencyPolicySpec.model_validate(doc["spec"])
    assert spec.mode in (Mode.OBSERVE, Mode.ENFORCE)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_ship_in_observe_mode(path: Path) -> None:
    """Observe first (safety rule 5): a sample applied as is never evicts; its comments say how to
    switch to Enforce."""
    doc = yaml.safe_load(path.read_text())
    assert GPUEfficiencyPolicySpec.model_validate(doc["spec"]).mode is Mode.OBSERVE
