"""Issue 31.2 under the chart's own ClusterRole (rbac.mode=enforce): every owner kind's write that
the API server committed and then answered 504 is settled by a re-read the role allows.

A re-read the role refuses (403) leaves the outcome UNKNOWN: counted against the budgets, but never
known to be done, so each such reclaim is reported as a failure to read. The e2e chaos run saw it for
Jobs (the role lists and patches jobs, it never gets them)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.chart.test_operator_templates import _cluster_role_rules

from gpu_efficiency.actuators.owners import PLURALS, reclaim_owner
from gpu_efficiency.api import names
from gpu_efficiency.api.suspend_fields import is_suspended
from gpu_efficiency.engine.outcomes import Result

from .fake_custom import FakeCustom, Key
from .test_owners import NOW, action

#: kind -> (apiVersion, the action the engine takes on it)
OWNERS: dict[str, tuple[str, str]] = {
    "Deployment": ("apps/v1", "ScaleToZero"),
    "ReplicaSet": ("apps/v1", "ScaleToZero"),
    "StatefulSet": ("apps/v1", "ScaleToZero"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "ScaleToZero"),
    "Job": ("batch/v1", "Suspend"),
    "JobSet": ("jobset.x-k8s.io/v1alpha2", "Suspend"),
    "Notebook": ("kubeflow.org/v1", "Stop"),
    "RayCluster": ("ray.io/v1", "Suspend"),
    "RayJob": ("ray.io/v1", "Suspend"),
    "PyTorchJob": ("kubeflow.org/v1", "Suspend"),
    "MPIJob": ("kubeflow.org/v1", "Suspend"),
    "TFJob": ("kubeflow.org/v1", "Suspend"),
    "TrainJob": ("trainer.kubeflow.org/v1alpha1", "Suspend"),
    "Workload": ("kueue.x-k8s.io/v1beta1", "Deactivate"),
}


class UnderRole(FakeCustom):
    """The fake API server answering 403 to every request the chart's enforce role does not grant."""

    def __init__(self) -> None:
        super().__init__()
        self.role = _cluster_role_rules(enforce=True)
        self.refused: list[str] = []

    def _allow(self, verb: str, group: str, resource: str) -> None:
        if verb not in self.role.get((group, resource), set()):
            self.refused.append(f"{verb} {group}/{resource}")
            raise ApiException(status=403, reason="Forbidden")

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        self._allow("get", group, plural)
        return super().get_namespaced_custom_object(group, version, namespace, plural, name)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, *, field_selector: str = ""
    ) -> Any:
        self._allow("list", group, plural)
        return super().list_namespaced_custom_object(
            group, version, namespace, plural, field_selector=field_selector
        )

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **kwargs: Any
    ) -> Any:
        self._allow("patch", group, plural)
        return super().patch_namespaced_custom_object(group, version, namespace, plural, name, body, **kwargs)

    def get_namespaced_custom_object_scale(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        self._allow("get", group, f"{plural}/scale")
        return super().get_namespaced_custom_object_scale(group, version, namespace, plural, name)

    def patch_namespaced_custom_object_scale(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **kwargs: Any
    ) -> Any:
        self._allow("patch", group, f"{plural}/scale")
        return super().patch_namespaced_custom_object_scale(
            group, version, namespace, plural, name, body, **kwargs
        )


def test_the_table_covers_every_kind_the_operator_reclaims() -> None:
    assert set(OWNERS) == set(PLURALS)


@pytest.mark.parametrize("kind", sorted(OWNERS))
def test_a_write_committed_then_answered_504_is_settled_by_a_re_read_the_role_allows(kind: str) -> None:
    api_version, what = OWNERS[kind]
    group, _, version = api_version.rpartition("/")
    key: Key = (group, version, "ml", PLURALS[kind], "x")
    api = UnderRole()
    obj = api.add(key, replicas=2) if what == "ScaleToZero" else api.add(key, active=True)
    write = "patch scale" if what == "ScaleToZero" else "patch"
    api.after[write] = ApiException(status=504, reason="Gateway Timeout")

    outcome = reclaim_owner(api, action(kind, "x", what, api_version), NOW)  # type: ignore[arg-type]

    assert api.refused == [], f"the chart's role refuses {api.refused}"
    assert outcome.result is Result.DONE, outcome.message
    annotations = obj["metadata"]["annotations"]
    assert annotations[names.RECLAIMED] == what  # the way back stays on the owner
    if what == "ScaleToZero":
        assert obj["spec"]["replicas"] == 0
        assert annotations[names.PREVIOUS_REPLICAS] == "2"
    elif what == "Stop":
        assert names.KUBEFLOW_STOPPED in annotations
    else:
        assert is_suspended(kind, obj["spec"]), obj["spec"]
