"""Every shipped sample policy is valid against the models (the CRD is generated from them)."""

import re
from pathlib import Path

import pytest
import yaml

from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.policy import GROUP, KIND, VERSION, GPUEfficiencyPolicySpec, Mode
from gpu_efficiency.engine.selection import compile_selector

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


# --- each platform sample selects that platform's pods -----------------------------------------
# Pod labels as the platforms set them (sources cited in the samples' headers):
# Kubeflow notebook-controller, generateStatefulSet: statefulset and notebook-name, plus the
# Notebook's own labels copied onto the pod template.
KUBEFLOW_NOTEBOOK_POD = {
    "statefulset": "nb-gpu",
    "notebook-name": "nb-gpu",
    "app": "nb-gpu",
    "controller-revision-hash": "nb-gpu-6d9c8f",
    "statefulset.kubernetes.io/pod-name": "nb-gpu-0",
}
# KubeSpawner (the spawner of Zero to JupyterHub), _build_pod_labels and common_labels; before
# KubeSpawner 7 only `component` was set, so the sample must select on that one.
JUPYTERHUB_SERVER_POD = {
    "app.kubernetes.io/name": "jupyterhub",
    "app.kubernetes.io/managed-by": "kubespawner",
    "app": "jupyterhub",
    "heritage": "jupyterhub",
    "component": "singleuser-server",
    "app.kubernetes.io/component": "singleuser-server",
    "hub.jupyter.org/username": "alice",
    "hub.jupyter.org/servername": "",
}
JUPYTERHUB_SERVER_POD_KUBESPAWNER_6 = {
    "app": "jupyterhub",
    "heritage": "jupyterhub",
    "component": "singleuser-server",
    "hub.jupyter.org/username": "alice",
}
# Pods of the same clusters that such a policy must leave alone.
OTHER_PODS = {
    "jupyterhub hub": {"app": "jupyterhub", "component": "hub", "heritage": "jupyterhub"},
    "jupyterhub image puller": {"app": "jupyterhub", "component": "continuous-image-puller"},
    "training job": {"batch.kubernetes.io/job-name": "train", "app.kubernetes.io/component": "trainer"},
    "kubeflow pipeline step": {
        "workflows.argoproj.io/workflow": "wf",
        "pipelines.kubeflow.org/v2_component": "true",
    },
}
PLATFORM_SAMPLES = {
    "idle-notebook-reclamation.yaml": (KUBEFLOW_NOTEBOOK_POD,),
    "idle-jupyterhub-servers.yaml": (JUPYTERHUB_SERVER_POD, JUPYTERHUB_SERVER_POD_KUBESPAWNER_6),
}
SAMPLE_DIR = Path(__file__).resolve().parents[3] / "config" / "samples"


def _spec(name: str) -> GPUEfficiencyPolicySpec:
    return GPUEfficiencyPolicySpec.model_validate(yaml.safe_load((SAMPLE_DIR / name).read_text())["spec"])


@pytest.mark.parametrize("name", sorted(PLATFORM_SAMPLES))
def test_a_platform_sample_selects_that_platforms_pods_and_no_other(name: str) -> None:
    spec = _spec(name)
    assert not spec.selection.namespace_selector.match_labels, "works without labelling namespaces"
    assert not spec.selection.namespace_selector.match_expressions
    matches = compile_selector(spec.selection.pod_selector)
    for labels in PLATFORM_SAMPLES[name]:
        assert matches(labels), labels
    assert [what for what, labels in OTHER_PODS.items() if matches(labels)] == []


def test_the_jupyterhub_sample_can_reclaim_bare_pods() -> None:
    """KubeSpawner's servers have no owner: without allowBarePods the sample would never act."""
    spec = _spec("idle-jupyterhub-servers.yaml")
    assert spec.eviction.allow_bare_pods


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_a_stated_warn_time_is_window_plus_idle_for(path: Path) -> None:
    """The idle clock starts once a whole window was idle, so a pod is warned window + idleFor after
    its last activity; a header that promises a warn time must say that sum."""
    text = path.read_text()
    spec = GPUEfficiencyPolicySpec.model_validate(yaml.safe_load(text)["spec"])
    stated = re.findall(r"warned after window \+ idleFor =[\s#]+(\S+) \+ (\S+) = (\S+?)[\s(]", text)
    if path.name in PLATFORM_SAMPLES:
        assert stated, "a notebook sample says when a notebook is warned"
    for window, idle_for, total in stated:
        assert (window, idle_for) == (spec.window, spec.idle.idle_for)
        assert parse_duration(total) == parse_duration(spec.window) + parse_duration(spec.idle.idle_for)
