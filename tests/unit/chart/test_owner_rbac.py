"""The ClusterRole against the owner integrations in the code: every owner kind the source lists is
listable, every kind the actuator patches is patchable, and nothing more is granted on them (a
missing verb would only show up as an integration silently skipped, or a reclaim failing with 403)."""

from __future__ import annotations

from gpu_efficiency.actuators.owners import PLURALS
from gpu_efficiency.engine.reclaim.owners import OWNER_GROUPS
from gpu_efficiency.sources.kube.crd_owners import CRD_OWNER_KINDS
from gpu_efficiency.sources.kube.owners import OWNER_KINDS

from .test_operator_templates import _cluster_role_rules


def _verbs() -> dict[tuple[str, str], set[str]]:
    """The ClusterRole of rbac.mode=enforce (observe grants the same reads, no patch)."""
    return _cluster_role_rules(enforce=True)


def test_every_owner_kind_read_is_listable() -> None:
    verbs = _verbs()
    missing = [k.path for k in OWNER_KINDS if "list" not in verbs.get((k.group, k.plural), set())]
    assert missing == []


def test_every_owner_kind_acted_on_is_patchable() -> None:
    verbs = _verbs()
    groups = dict(OWNER_GROUPS) | {"Workload": "kueue.x-k8s.io"}
    missing = [
        (groups[kind], plural)
        for kind, plural in PLURALS.items()
        if "patch" not in verbs.get((groups[kind], plural), set())
    ]
    assert missing == []


def test_kuberay_kubeflow_training_and_kueue_get_exactly_list_and_patch() -> None:
    verbs = _verbs()
    granted = {(group, plural): verbs.get((group, plural)) for _, group, _, plural in CRD_OWNER_KINDS}
    assert granted == {
        ("ray.io", "rayclusters"): {"list", "patch"},
        ("ray.io", "rayjobs"): {"list", "patch"},
        ("kubeflow.org", "pytorchjobs"): {"list", "patch"},
        ("kubeflow.org", "mpijobs"): {"list", "patch"},
        ("kubeflow.org", "tfjobs"): {"list", "patch"},
        ("trainer.kubeflow.org", "trainjobs"): {"list", "patch"},
        ("kueue.x-k8s.io", "workloads"): {"list", "patch"},
    }
