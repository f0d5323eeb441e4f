"""Owner objects and HPA targets read for owner resolution; CRD integrations found by discovery."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import OwnerRef
from gpu_efficiency.sources.kube.cluster import pod_view
from gpu_efficiency.sources.kube.owners import HPA_PATH, PDB_PATH, OwnerReader, OwnersUnavailable


def meta(
    name: str, namespace: str = "ml", controller: tuple[str, str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", **extra}
    if controller:
        api, kind, owner = controller
        out["ownerReferences"] = [
            {"apiVersion": api, "kind": kind, "name": owner, "uid": f"uid-{owner}", "controller": True}
        ]
    return out


class FakeApi:
    """Paths -> documents; a path mapped to an int answers that HTTP status."""

    def __init__(self, docs: Mapping[str, Any]) -> None:
        self.docs = dict(docs)
        self.calls: list[str] = []

    def __call__(self, path: str, query: Mapping[str, str]) -> Mapping[str, Any]:
        self.calls.append(path + ("?continue=" + query["continue"] if "continue" in query else ""))
        doc = self.docs.get(path + ("?" + query["continue"] if "continue" in query else ""), 404)
        if isinstance(doc, int):
            raise ApiException(status=doc, reason="Not Found" if doc == 404 else "Forbidden")
        return doc


def builtin(**lists: list[dict[str, Any]]) -> dict[str, Any]:
    plural = {
        "replicasets": "apps",
        "deployments": "apps",
        "statefulsets": "apps",
        "jobs": "batch",
        "cronjobs": "batch",
    }
    docs: dict[str, Any] = {
        f"/apis/{group}/v1/{name}": {"items": lists.get(name, [])} for name, group in plural.items()
    }
    docs[HPA_PATH] = {"items": lists.get("hpas", [])}
    docs[PDB_PATH] = {"items": lists.get("pdbs", [])}
    return docs


def test_objects_controllers_replicas_and_hpa_targets_are_read() -> None:
    docs = builtin(
        replicasets=[{"metadata": meta("nb-5d9", controller=("apps/v1", "Deployment", "nb"))}],
        deployments=[
            {
                "metadata": meta("nb", annotations={names.RECLAIMED: "ScaleToZero", "other": "x"}),
                "spec": {"replicas": 0},
            },
            {"metadata": meta("web"), "spec": {}},
        ],
        jobs=[{"metadata": meta("train"), "spec": {"suspend": True}}],
        cronjobs=[{"metadata": meta("nightly"), "spec": {"concurrencyPolicy": "Forbid", "suspend": False}}],
        hpas=[
            {"metadata": meta("web-hpa"), "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}
        ],
    )
    state = OwnerReader(FakeApi(docs)).read()
    rs = state.objects[("ml", "ReplicaSet", "nb-5d9")]
    assert rs.controller == OwnerRef("apps/v1", "Deployment", "nb", "uid-nb")
    nb = state.objects[("ml", "Deployment", "nb")]
    assert (nb.replicas, dict(nb.annotations)) == (0, {names.RECLAIMED: "ScaleToZero"})
    assert state.objects[("ml", "Deployment", "web")].replicas == 1  # the API's default
    assert state.objects[("ml", "Job", "train")].suspended
    assert state.objects[("ml", "CronJob", "nightly")].concurrency_policy == "Forbid"
    assert state.objects[("ml", "Job", "train")].concurrency_policy == ""
    assert state.autoscalers == {("ml", "Deployment", "web"): "web-hpa"}


def test_pages_are_followed() -> None:
    docs = builtin()
    docs["/apis/apps/v1/deployments"] = {"items": [{"metadata": meta("a")}], "metadata": {"continue": "t1"}}
    docs["/apis/apps/v1/deployments?t1"] = {"items": [{"metadata": meta("b")}]}
    state = OwnerReader(FakeApi(docs)).read()
    assert {("ml", "Deployment", "a"), ("ml", "Deployment", "b")} <= set(state.objects)


def test_crds_not_served_are_skipped_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    docs = builtin()
    docs["/apis/kubeflow.org/v1"] = {"resources": [{"name": "notebooks"}]}
    docs["/apis/kubeflow.org/v1/notebooks"] = {
        "items": [{"metadata": meta("lab", annotations={names.KUBEFLOW_STOPPED: "2026-01-01T00:00:00Z"})}]
    }
    fake = FakeApi(docs)
    reader = OwnerReader(fake)
    with caplog.at_level(logging.INFO, logger="gpu_efficiency.sources.kube.owners"):
        state = reader.read()
        reader.read()
    lab = state.objects[("ml", "Notebook", "lab")]
    assert lab.ref.api_version == "kubeflow.org/v1"
    assert names.KUBEFLOW_STOPPED in lab.annotations
    skipped = [r.getMessage() for r in caplog.records if "integration skipped" in r.getMessage()]
    assert sorted(m.split()[0] for m in skipped) == [
        "InferenceService",
        "JobSet",
        "LeaderWorkerSet",
        "MPIJob",
        "PyTorchJob",
        "RayCluster",
        "RayJob",
        "TFJob",
        "TrainJob",
        "Workload",  # once, though two of its versions are tried
    ]
    assert fake.calls.count("/apis/kubeflow.org/v1") == 1  # discovery is remembered


def test_a_crd_list_forbidden_is_skipped_but_a_builtin_failure_is_an_error() -> None:
    docs = builtin()
    docs["/apis/jobset.x-k8s.io/v1alpha2"] = {"resources": [{"name": "jobsets"}]}
    docs["/apis/jobset.x-k8s.io/v1alpha2/jobsets"] = 403
    assert OwnerReader(FakeApi(docs)).read().objects == {}
    docs["/apis/apps/v1/deployments"] = 403
    with pytest.raises(OwnersUnavailable, match="deployments: HTTP 403"):
        OwnerReader(FakeApi(docs)).read()


def test_the_pod_view_keeps_its_controller_reference() -> None:
    view = pod_view(
        {"metadata": meta("p", controller=("apps/v1", "ReplicaSet", "nb-5d9")), "spec": {}, "status": {}}
    )
    assert view.controller == OwnerRef("apps/v1", "ReplicaSet", "nb-5d9", "uid-nb-5d9")
    assert view.controller_kind == "ReplicaSet"
    assert pod_view({"metadata": meta("bare"), "spec": {}, "status": {}}).controller is None


def test_api_fetch_lists_through_the_custom_objects_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client

    from gpu_efficiency.sources.kube.owners import api_fetch

    calls: list[tuple[Any, ...]] = []

    class Response:
        data = b'{"items": []}'

    def listing(self: Any, group: str, version: str, plural: str, **kwargs: Any) -> Response:
        calls.append(
            (group, version, plural, kwargs["limit"], kwargs["_continue"], kwargs["_preload_content"])
        )
        return Response()

    def discovery(self: Any, group: str, version: str, **kwargs: Any) -> Response:
        calls.append((group, version))
        return Response()

    monkeypatch.setattr(client.CustomObjectsApi, "list_cluster_custom_object", listing)
    monkeypatch.setattr(client.CustomObjectsApi, "get_api_resources", discovery)
    fetch = api_fetch(client.ApiClient())
    assert fetch("/apis/apps/v1/deployments", {"limit": "500", "continue": "t"}) == {"items": []}
    fetch("/apis/kubeflow.org/v1", {})
    assert calls == [("apps", "v1", "deployments", 500, "t", False), ("kubeflow.org", "v1")]


def test_disruption_budgets_are_read_with_their_selector_and_allowance() -> None:
    docs = builtin(
        pdbs=[
            {
                "metadata": meta("guard"),
                "spec": {"selector": {"matchLabels": {"app": "nb"}}},
                "status": {"disruptionsAllowed": 0},
            },
            {
                "metadata": meta("none"),
                "spec": {},
                "status": {"disruptionsAllowed": 0},
            },  # null selector: no pod
            {
                "metadata": meta("odd"),
                "spec": {"selector": {"bogus": 1}},
                "status": {},
            },  # unreadable: all pods
        ]
    )
    budgets = OwnerReader(FakeApi(docs)).read().disruption_budgets
    assert [(b.name, dict(b.selector.match_labels), b.disruptions_allowed) for b in budgets] == [
        ("guard", {"app": "nb"}, 0),
        ("odd", {}, 0),
    ]


def test_a_crd_installed_later_is_picked_up_at_the_next_discovery(caplog: pytest.LogCaptureFixture) -> None:
    docs = builtin()
    clock = [0.0]
    reader = OwnerReader(FakeApi(docs), clock=lambda: clock[0])
    reader.read()
    docs["/apis/kubeflow.org/v1"] = {"resources": [{"name": "notebooks"}]}
    docs["/apis/kubeflow.org/v1/notebooks"] = {"items": [{"metadata": meta("lab")}]}
    reader.fetch = FakeApi(docs)
    assert ("ml", "Notebook", "lab") not in reader.read().objects  # discovery is remembered a while
    clock[0] = 61.0
    with caplog.at_level(logging.INFO, logger="gpu_efficiency.sources.kube.owners"):
        assert ("ml", "Notebook", "lab") in reader.read().objects
    assert any("Notebook integration enabled" in r.getMessage() for r in caplog.records)
