"""The watched owners (``owner_cache.py``): the same state a LIST read gives, no request while nothing
changes, a change seen through the watch, and no state at all where the watch cannot stand for a
read (not synced, a CRD owner kind installed)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.unit.sources.kube.fake_watch_api import FakeListApi, FakeStream, event, wait_until
from tests.unit.sources.kube.test_owner_reader import FakeApi, builtin, meta

from gpu_efficiency.sources.kube.owner_cache import OwnerCache, WatchedOwnerReader
from gpu_efficiency.sources.kube.owners import HPA_PATH, PDB_PATH, OwnerReader
from gpu_efficiency.sources.kube.watch import Backoff

FAST = Backoff(initial=0.001, maximum=0.002)
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def versioned(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def cluster_docs() -> dict[str, Any]:
    return builtin(
        replicasets=[{"metadata": meta("nb-5d9", controller=("apps/v1", "Deployment", "nb"))}],
        deployments=[
            {"metadata": meta("nb"), "spec": {"replicas": 1}},
            {"metadata": meta("web"), "spec": {}},
        ],
        jobs=[{"metadata": meta("train"), "spec": {"suspend": False}}],
        cronjobs=[{"metadata": meta("nightly"), "spec": {"concurrencyPolicy": "Forbid"}}],
        hpas=[
            {"metadata": meta("web-hpa"), "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}}}
        ],
        pdbs=[
            {
                "metadata": meta("nb-pdb"),
                "spec": {"selector": {"matchLabels": {"app": "nb"}}},
                "status": {"disruptionsAllowed": 0},
            }
        ],
    )


class Server:
    """Every owner path's objects, served to the informers (``FakeListApi``, watched) and to the
    LIST reader (``FakeApi``) alike."""

    def __init__(self, docs: dict[str, Any], crds: list[dict[str, Any]] | None = None) -> None:
        self.apis: dict[str, FakeListApi] = {}
        for path, doc in {**docs, CRDS: {"items": crds or []}}.items():
            items = [versioned(o, 10 + i) for i, o in enumerate(doc["items"])]
            self.apis[path] = FakeListApi(items, rv=100)
        self.streams = {path: api.next_watch() for path, api in self.apis.items()}

    def list_for(self, group: str, version: str, plural: str) -> Callable[..., Any]:
        return self.apis[f"/apis/{group}/{version}/{plural}"]

    def lister(self) -> FakeApi:
        return FakeApi({path: {"items": api.objects} for path, api in self.apis.items()})

    def stream(self, path: str) -> FakeStream:
        return self.streams[path]


@pytest.fixture
def readers() -> Iterator[list[WatchedOwnerReader]]:
    made: list[WatchedOwnerReader] = []
    yield made
    for reader in made:
        reader.stop()


def watched(
    server: Server, made: list[WatchedOwnerReader], *, sync: bool = True
) -> tuple[WatchedOwnerReader, FakeApi]:
    lister = server.lister()
    reader = WatchedOwnerReader(OwnerCache(server.list_for, backoff=FAST), OwnerReader(lister))
    made.append(reader)
    reader.start()
    if sync:
        assert reader.cache.wait_synced(5)
    return reader, lister


def test_the_watched_owners_are_what_a_list_reads_and_cost_no_request(
    readers: list[WatchedOwnerReader],
) -> None:
    server = Server(cluster_docs())
    reader, lister = watched(server, readers)
    listed = OwnerReader(server.lister()).read()
    for _ in range(5):
        current = reader.current()
        assert current is not None
        assert dict(current.objects) == dict(listed.objects)
        assert (
            dict(current.autoscalers) == dict(listed.autoscalers) == {("ml", "Deployment", "web"): "web-hpa"}
        )
        assert current.disruption_budgets == listed.disruption_budgets
        assert len(current.disruption_budgets) == 1
        assert current.requests == 0
    assert lister.calls == []
    assert all(api.lists == 1 for api in server.apis.values())  # each informer's first LIST only


def test_a_new_hpa_is_seen_through_the_watch_without_a_list(readers: list[WatchedOwnerReader]) -> None:
    server = Server(cluster_docs())
    reader, lister = watched(server, readers)
    hpa = {"metadata": meta("nb-hpa"), "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "nb"}}}
    server.stream(HPA_PATH).put(event("ADDED", versioned(hpa, 200)))
    wait_until(lambda: (c := reader.current()) is not None and ("ml", "Deployment", "nb") in c.autoscalers)
    server.stream(PDB_PATH).put(event("DELETED", server.apis[PDB_PATH].objects[0]))
    wait_until(lambda: (c := reader.current()) is not None and c.disruption_budgets == ())
    assert lister.calls == []


def test_no_watched_state_before_the_first_list_nor_with_a_crd_owner_kind_installed(
    readers: list[WatchedOwnerReader],
) -> None:
    server = Server(cluster_docs())
    server.apis[HPA_PATH].list_gate = gate = threading.Event()
    reader, _ = watched(server, readers, sync=False)
    assert reader.current() is None  # the HPAs not listed yet: the runtime reuses its last LIST
    gate.set()
    assert reader.cache.wait_synced(5)
    assert reader.current() is not None
    kueue = {
        "metadata": {"name": "workloads.kueue.x-k8s.io", "uid": "crd-1", "resourceVersion": "300"},
        "spec": {
            "group": "kueue.x-k8s.io",
            "names": {"plural": "workloads", "kind": "Workload"},
            "versions": [{"name": "v1beta2", "served": True}],
        },
    }
    other = {
        "metadata": {"name": "widgets.example.com", "uid": "crd-2", "resourceVersion": "301"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets"},
            "versions": [{"name": "v1", "served": True}],
        },
    }
    server.stream(CRDS).put(event("ADDED", other))
    wait_until(lambda: reader.cache.crds.events >= 1)
    assert reader.current() is not None  # a CRD that is no owner kind changes nothing
    server.stream(CRDS).put(event("ADDED", kueue))
    wait_until(lambda: reader.current() is None)  # Workloads are only LISTed: the LIST path serves
