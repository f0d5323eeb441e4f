"""Scope: Kubernetes label selector semantics and the pod filters, protected namespaces untouched."""

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import LabelSelector
from gpu_efficiency.engine.model import AnnotatePod, NamespaceView, Snapshot
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.selection import compile_selector
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    gpu,
    no_faults,  # noqa: F401 (fixture)
    node,
    pod,
    policy,
    snapshot,
)

pytestmark = pytest.mark.usefixtures("no_faults")


def sel(match_labels: dict[str, str] | None = None, *exprs: tuple[str, str, list[str]]) -> LabelSelector:
    return LabelSelector.model_validate(
        {
            "match_labels": match_labels or {},
            "match_expressions": [{"key": k, "operator": op, "values": list(v)} for k, op, v in exprs],
        }
    )


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (sel(), {}, True),
        (sel({"team": "a"}), {"team": "a", "x": "y"}, True),
        (sel({"team": "a"}), {"team": "b"}, False),
        (sel({"team": "a"}), {}, False),
        (sel(None, ("tier", "In", ["gpu", "ml"])), {"tier": "ml"}, True),
        (sel(None, ("tier", "In", ["gpu", "ml"])), {"tier": "web"}, False),
        (sel(None, ("tier", "In", ["gpu"])), {}, False),
        (sel(None, ("tier", "NotIn", ["web"])), {"tier": "ml"}, True),
        (sel(None, ("tier", "NotIn", ["web"])), {}, True),
        (sel(None, ("tier", "NotIn", ["web"])), {"tier": "web"}, False),
        (sel(None, ("gpu", "Exists", [])), {"gpu": ""}, True),
        (sel(None, ("gpu", "Exists", [])), {}, False),
        (sel(None, ("gpu", "DoesNotExist", [])), {}, True),
        (sel(None, ("gpu", "DoesNotExist", [])), {"gpu": "x"}, False),
        (sel({"team": "a"}, ("gpu", "Exists", [])), {"team": "a"}, False),  # AND of all terms
    ],
)
def test_label_selector_semantics(selector: LabelSelector, labels: dict[str, str], matches: bool) -> None:
    assert compile_selector(selector)(labels) is matches


def judged(snap: Snapshot) -> list[str]:
    return sorted(f"{v.namespace}/{v.name}" for v in plan_cycle(snap).verdicts)


def test_pod_filters() -> None:
    pods = [
        pod("ok"),
        pod("cpu-only", gpu_request=0),
        pod("pending", phase="Pending"),
        pod("going", deleting=True),
        pod("sys", "kube-system"),
        pod("op", "gpu-efficiency-system"),
        pod("skip", "excluded-ns"),
    ]
    gpus = [gpu(f"GPU-{p.name}", b.compute_bound(), (p.namespace, p.name)) for p in pods]
    snap = snapshot(gpus, pods, policy(selection={"excluded_namespaces": ["excluded-ns"]}))
    assert judged(snap) == ["team-a/ok"]


def test_namespace_pod_and_node_selectors() -> None:
    pods = [
        pod("a", "ml", labels={"app": "train"}, node="gpu-1"),
        pod("b", "ml", labels={"app": "web"}, node="gpu-1"),
        pod("c", "web", labels={"app": "train"}, node="gpu-1"),
        pod("d", "ml", labels={"app": "train"}, node="cpu-1"),
        pod("e", "unlisted", labels={"app": "train"}, node="gpu-1"),
    ]
    spec = policy(
        selection={
            "namespace_selector": {"match_labels": {"gpu": "yes"}},
            "pod_selector": {"match_labels": {"app": "train"}},
            "node_selector": {"match_expressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
        }
    )
    snap = snapshot(
        [gpu(f"GPU-{p.name}", b.compute_bound(), (p.namespace, p.name)) for p in pods],
        pods,
        spec,
        nodes=[node("gpu-1", {"pool": "gpu"}), node("cpu-1", {"pool": "cpu"})],
        namespaces=[NamespaceView("ml", {"gpu": "yes"}), NamespaceView("web", {})],
    )
    assert judged(snap) == ["ml/a"]


def test_out_of_scope_pod_with_our_annotations_is_cleaned_but_protected_never_touched() -> None:
    ours = {names.STATE: "Idle", names.POLICY: "test-policy", names.IDLE_SINCE: "2023-01-01T00:00:00Z"}
    pods = [
        pod("left", "team-b", annotations=ours),
        pod("sys", "kube-system", annotations=ours),
        pod("other", "team-b", annotations={**ours, names.POLICY: "another-policy"}),
    ]
    spec = policy(selection={"excluded_namespaces": ["team-b"]})
    plan = plan_cycle(snapshot([], pods, spec))
    patches = {a.name: a.annotations for a in plan.actions if isinstance(a, AnnotatePod)}
    assert patches == {"left": dict.fromkeys(ours)}
