"""The informer and the cached reader: list then watch, events, bookmarks, 410, errors, snapshots,
fallback to LIST, read-your-writes (an in-memory list/watch API; the real client in another test)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.sources.kube.fake_watch_api import (
    FakeListApi,
    bookmark,
    event,
    expired,
    gone,
    pod,
    wait_until,
)
from urllib3.exceptions import ReadTimeoutError

from gpu_efficiency import metrics
from gpu_efficiency.engine.model import NamespaceView, NodeView, PendingPod, PodView, Toleration
from gpu_efficiency.engine.reclaim.pressure import waiting_for_gpus
from gpu_efficiency.sources.kube.cluster import ClusterState, pending_view, pod_view
from gpu_efficiency.sources.kube.cluster_cache import BoundPod, CachedClusterReader, bound_pod
from gpu_efficiency.sources.kube.watch import RELIST_AFTER_FAILURES, Backoff, Informer, Projection, iter_lines
from gpu_efficiency.sources.metrics.targets import PodAddress

FAST = Backoff(initial=0.001, maximum=0.002)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def informer(api: FakeListApi, **options: Any) -> Informer[PodView]:
    options.setdefault("backoff", FAST)
    return Informer(
        "pods",
        api,
        pod_view,
        keep=lambda v: v.gpu_request > 0,
        order=lambda v: (v.namespace, v.name),
        **options,
    )


@pytest.fixture
def started() -> Iterator[list[Informer[Any]]]:
    informers: list[Informer[Any]] = []
    yield informers
    for i in informers:
        i.stop()


def start(inf: Informer[Any], started: list[Informer[Any]]) -> Informer[Any]:
    started.append(inf)
    inf.start()
    assert inf.wait_synced(5)
    return inf


def names(inf: Informer[PodView]) -> list[str]:
    snap = inf.snapshot()
    assert snap is not None
    return [v.name for v in snap]


def metric(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


def test_iter_lines_joins_split_lines_and_splits_joined_ones() -> None:
    chunks = [b'{"a":', b"1}\n{", b'"b":2}\n\n{"c":3}\n', b'{"d"', b":4}"]
    assert list(iter_lines(chunks)) == [b'{"a":1}', b'{"b":2}', b'{"c":3}', b'{"d":4}']


def test_pages_through_the_list_keeping_only_gpu_pods_in_list_order(started: list[Informer[Any]]) -> None:
    api = FakeListApi(
        [pod(f"p{i}", f"u{i}", 10 + i, gpus=0 if i == 3 else 1, namespace=f"ns{i % 2}") for i in range(5)]
    )
    api.next_watch()
    inf = start(informer(api, page_size=2), started)
    assert api.lists == 3  # 5 objects, 2 a page
    assert [c.get("_continue") for c in api.calls[:3]] == [None, "2", "4"]
    assert names(inf) == ["p0", "p2", "p4", "p1"]  # by namespace, then name; p3 has no GPU
    assert inf.resource_version == "100"
    wait_until(lambda: api.watch_calls)
    assert api.watch_calls[0]["resource_version"] == "100"


def test_added_modified_deleted_update_the_map(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    stream.put(event("ADDED", pod("b", "ub", 101)))
    wait_until(lambda: names(inf) == ["a", "b"])
    stream.put(event("MODIFIED", pod("b", "ub", 102, annotations={"gpuefficiency.io/state": "Idle"})))
    wait_until(lambda: (s := inf.snapshot()) and s[1].annotations == {"gpuefficiency.io/state": "Idle"})
    stream.put(event("DELETED", pod("a", "ua", 103)))
    wait_until(lambda: names(inf) == ["b"])
    assert inf.resource_version == "103"
    assert inf.relists == 1


def test_the_change_listener_sees_each_watched_change_before_and_after(started: list[Informer[Any]]) -> None:
    """The hook early fault cycles hang on (runtime/fault_wake.py): not the LIST, every watched
    change with the view before it, and a listener's exception does not stop the watch."""
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = informer(api)
    seen: list[tuple[str | None, str | None, str | None]] = []

    def listener(before: PodView | None, after: PodView | None) -> None:
        seen.append(
            (
                before and before.name,
                after and after.name,
                after and after.annotations.get("gpuefficiency.io/state"),
            )
        )
        if after is not None and after.name == "b" and len(seen) == 1:
            raise RuntimeError("a listener bug")

    inf.on_change = listener
    start(inf, started)
    stream.put(event("ADDED", pod("b", "ub", 101)))
    stream.put(event("MODIFIED", pod("b", "ub", 102, annotations={"gpuefficiency.io/state": "Idle"})))
    stream.put(event("MODIFIED", pod("a", "ua", 103, gpus=0)))  # no longer kept: gone from the map
    wait_until(lambda: inf.resource_version == "103")
    assert seen == [(None, "b", None), ("b", "b", "Idle"), ("a", None, None)]


def test_a_pod_no_longer_kept_is_dropped_and_one_leaving_the_selector_arrives_deleted(
    started: list[Informer[Any]],
) -> None:
    api = FakeListApi([pod("a", "ua", 50), pod("b", "ub", 51)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    stream.put(event("MODIFIED", pod("a", "ua", 101, gpus=0)))
    stream.put(event("DELETED", pod("b", "ub", 102)))  # what the API sends when b leaves the selector
    stream.put(event("ADDED", pod("c", "uc", 103, gpus=0)))
    wait_until(lambda: inf.resource_version == "103")
    assert names(inf) == []


def test_a_bookmark_advances_the_version_and_leaves_the_snapshot_alone(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    first = api.next_watch()
    inf = start(informer(api), started)
    before = inf.snapshot()
    first.put(bookmark(150))
    wait_until(lambda: inf.resource_version == "150")
    assert inf.snapshot() is before  # nothing changed: the same tuple, not a copy
    api.next_watch()
    first.end()  # the server's timeout: re-watch from the bookmark, no relist
    wait_until(lambda: len(api.watch_calls) == 2)
    assert api.watch_calls[1]["resource_version"] == "150"
    assert inf.relists == 1


def test_a_snapshot_is_isolated_from_later_events(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    snap = inf.snapshot()
    assert snap is not None
    stream.put(event("ADDED", pod("b", "ub", 101)), event("DELETED", pod("a", "ua", 102)))
    wait_until(lambda: names(inf) == ["b"])
    assert [v.name for v in snap] == ["a"]
    assert isinstance(snap, tuple)


def test_410_error_event_relists_and_replaces_the_map(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50), pod("b", "ub", 51)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    relists = metric("gpu_efficiency_cache_relists_total", resource="pods", reason="expired")
    # While the watch was away, a was deleted and c created: the relist shows exactly that.
    api.objects = [pod("b", "ub", 51), pod("c", "uc", 160)]
    api.rv = 200
    api.next_watch()
    stream.put(expired())
    wait_until(lambda: inf.relists == 2)
    assert names(inf) == ["b", "c"]
    wait_until(lambda: len(api.watch_calls) == 2)
    assert api.watch_calls[1]["resource_version"] == "200"
    assert metric("gpu_efficiency_cache_relists_total", resource="pods", reason="expired") == relists + 1


def test_http_410_on_the_watch_request_relists(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    first = api.next_watch()
    inf = start(informer(api), started)
    api.fail_next_watch(gone())
    api.next_watch()
    first.put(bookmark(110))
    first.end()
    wait_until(lambda: inf.relists == 2)
    assert api.lists == 2


def test_a_broken_connection_rewatches_from_the_last_version_with_backoff(
    started: list[Informer[Any]],
) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    stream.put(event("ADDED", pod("b", "ub", 120)))
    wait_until(lambda: inf.resource_version == "120")
    api.fail_next_watch(ApiException(status=503, reason="Unavailable"))
    again = api.next_watch()
    stream.fail(ConnectionResetError("reset by peer"))
    wait_until(lambda: len(api.watch_calls) == 3)
    assert [c["resource_version"] for c in api.watch_calls] == ["100", "120", "120"]
    assert inf.relists == 1  # nothing was lost: no relist
    again.put(event("ADDED", pod("c", "uc", 121)))
    wait_until(lambda: names(inf) == ["a", "b", "c"])
    assert inf.usable()


def test_a_silent_stream_is_stale_since_it_last_spoke_then_watched_again_then_relisted(
    started: list[Informer[Any]],
) -> None:
    clock = Clock()
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api, clock=clock, max_broken=75.0), started)
    stream.put(bookmark(101))
    wait_until(lambda: inf.resource_version == "101")
    clock.now += 130  # nothing since: not even the bookmark due every minute
    second = api.next_watch()
    stream.fail(ReadTimeoutError(None, "/", "read timed out"))  # type: ignore[arg-type]
    wait_until(lambda: len(api.watch_calls) == 2)
    assert api.watch_calls[1]["resource_version"] == "101"  # watched again, from where it was
    assert inf.snapshot() is None  # unvouched for since the bookmark, 130 s ago: cycles LIST
    second.put(bookmark(140))  # the new watch speaks: current again
    wait_until(lambda: inf.snapshot() is not None)
    # Silent twice in a row (a stream ended without a line counts too): relist.
    third = api.next_watch()
    second.fail(ReadTimeoutError(None, "/", "read timed out"))  # type: ignore[arg-type]
    wait_until(lambda: api.opened[-1] is third)
    api.next_watch()
    third.end()
    wait_until(lambda: inf.relists == 2)
    assert metric("gpu_efficiency_cache_relists_total", resource="pods", reason="silent") >= 1


def test_a_watch_the_server_accepts_but_never_serves_is_relisted(started: list[Informer[Any]]) -> None:
    """A version the server has not reached (etcd restored from a backup) is accepted and never
    answered: each watch ends empty at its timeout. Two in a row relist."""
    api = FakeListApi([pod("a", "ua", 50)])
    first = api.next_watch()
    inf = start(informer(api), started)
    second = api.next_watch()
    first.end()
    wait_until(lambda: api.opened[-1] is second)
    assert inf.relists == 1
    api.next_watch()
    second.end()
    wait_until(lambda: inf.relists == 2)


def test_repeated_watch_failures_end_in_a_relist(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    first = api.next_watch()
    inf = start(informer(api), started)
    for _ in range(RELIST_AFTER_FAILURES - 1):
        api.fail_next_watch(ApiException(status=500, reason="Internal"))
    api.next_watch()
    first.fail(ConnectionResetError("reset"))
    wait_until(lambda: inf.relists == 2)
    assert api.lists == 2
    assert (
        len(api.watch_calls) == RELIST_AFTER_FAILURES + 1
    )  # the first, four failed retries, then after the relist


def test_an_error_event_other_than_410_rewatches(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    api.next_watch()
    stream.put(event("ERROR", {"kind": "Status", "code": 500, "message": "internal"}))
    wait_until(lambda: len(api.watch_calls) == 2)
    assert api.watch_calls[1]["resource_version"] == "100"
    assert inf.relists == 1


def test_failed_lists_are_retried_until_synced(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    api.list_errors = [ApiException(status=500, reason="Internal"), ConnectionRefusedError("down")]
    api.next_watch()
    inf = informer(api)
    started.append(inf)
    inf.start()
    assert inf.wait_synced(5)
    assert api.lists == 3
    assert names(inf) == ["a"]


def test_not_usable_before_sync_and_after_the_watch_is_broken_too_long(started: list[Informer[Any]]) -> None:
    clock = Clock()
    api = FakeListApi([pod("a", "ua", 50)])
    inf = informer(api, clock=clock, max_broken=30.0, backoff=Backoff(initial=60, maximum=60))
    assert inf.snapshot() is None  # not started: never "no pods"
    stream = api.next_watch()
    start(inf, started)
    assert inf.snapshot() is not None
    errors = metric("gpu_efficiency_cache_watch_restarts_total", resource="pods", reason="error")
    stream.fail(ConnectionResetError("reset"))  # the retry waits 60 s (backoff): broken meanwhile
    wait_until(
        lambda: metric("gpu_efficiency_cache_watch_restarts_total", resource="pods", reason="error") > errors
    )
    clock.now += 29
    assert inf.snapshot() is not None  # a short outage: the cache is still read
    clock.now += 2
    assert inf.snapshot() is None
    assert metric("gpu_efficiency_cache_synced", resource="pods") == 0


def test_read_your_writes_takes_newer_objects_only(started: list[Informer[Any]]) -> None:
    api = FakeListApi([pod("a", "ua", 50)])
    stream = api.next_watch()
    inf = start(informer(api), started)
    assert inf.observe_written(pod("a", "ua", 60, annotations={"gpuefficiency.io/state": "Idle"}))
    snap = inf.snapshot()
    assert snap is not None
    assert snap[0].annotations == {"gpuefficiency.io/state": "Idle"}
    assert not inf.observe_written(pod("a", "ua", 55))  # older than what is held
    assert not inf.observe_written(pod("z", "uz", 70))  # not held (maybe deleted since): never added
    bad = pod("a", "ua", 80)
    bad["metadata"]["resourceVersion"] = "opaque"
    assert not inf.observe_written(bad)
    # The watch then delivers an event older than our write: skipped; the write's own event: applied.
    stream.put(event("MODIFIED", pod("a", "ua", 58, annotations={"gpuefficiency.io/state": "Efficient"})))
    wait_until(lambda: inf.resource_version == "58")
    snap = inf.snapshot()
    assert snap is not None
    assert snap[0].annotations == {"gpuefficiency.io/state": "Idle"}
    stream.put(event("MODIFIED", pod("a", "ua", 61, annotations={"gpuefficiency.io/state": "Warned"})))
    wait_until(lambda: (s := inf.snapshot()) and s[0].annotations == {"gpuefficiency.io/state": "Warned"})


def test_stop_is_prompt_while_the_watch_is_silent(started: list[Informer[Any]]) -> None:
    import time

    api = FakeListApi([])
    api.next_watch()
    inf = start(informer(api), started)
    wait_until(lambda: api.opened)
    t0 = time.monotonic()
    inf.stop()
    assert time.monotonic() - t0 < 2.0
    assert api.opened[0].closed


# -- the cached reader ---------------------------------------------------------------------------


class FakeFallback:
    """ClusterReader's LIST methods, counting calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_nodes(self) -> tuple[tuple[NodeView, ...], int]:
        self.calls.append("nodes")
        return (NodeView("listed-node", {}, {}, (), (), 8),), 2

    def list_namespaces(self) -> tuple[tuple[NamespaceView, ...], int]:
        self.calls.append("namespaces")
        return (NamespaceView("listed-ns", {}),), 1

    def list_pods(self) -> tuple[tuple[PodView, ...], int]:
        self.calls.append("pods")
        return (pod_view(pod("listed", "ul", 1)),), 16

    def list_pending(self) -> tuple[tuple[PendingPod, ...], int]:
        self.calls.append("pending")
        return (pending_view(pod("waiting", "uw", 1)),), 1


class NoPending:
    """A synced pending-pods informer holding none (the cycles these tests read have none waiting)."""

    synced = True

    def snapshot(self) -> tuple[()]:
        return ()

    def wait_synced(self, timeout: float) -> bool:
        return True

    def start(self) -> None:
        """Nothing to start."""


class FakeCache:
    def __init__(
        self,
        pods: Informer[PodView],
        nodes: Informer[Any],
        namespaces: Informer[Any],
        pending: Informer[Any] | NoPending | None = None,
    ) -> None:
        self.pods, self.nodes, self.namespaces = pods, nodes, namespaces
        self.pending = pending or NoPending()
        self.addresses = NoPending()  # the pods' addresses: synced, none (no scrape target here)

    def start(self) -> None:
        for informer in (self.pods, self.pending, self.nodes, self.namespaces):
            informer.start()

    def pod_written(self, obj: dict[str, Any]) -> None:
        self.pods.observe_written(obj)

    def pod_evicted(self, uid: str) -> None:
        self.pods.update(uid, lambda view: dataclasses.replace(view, deleting=True))


def node_obj(name: str, uid: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "resourceVersion": str(rv)},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def ns_obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"ns-{name}", "resourceVersion": str(rv)}}


def test_reader_lists_until_synced_then_reads_the_cache_with_no_requests(
    started: list[Informer[Any]],
) -> None:
    from gpu_efficiency.sources.kube.cluster import namespace_view, node_view

    pods_api, nodes_api, ns_api = (
        FakeListApi([pod("a", "ua", 50)]),
        FakeListApi([node_obj("n1", "un1", 5)]),
        FakeListApi([ns_obj("ns", 3)]),
    )
    pods_api.list_gate = threading.Event()  # the pod LIST hangs: pods not synced yet
    for api in (pods_api, nodes_api, ns_api):
        api.next_watch()
    pods = informer(pods_api)
    nodes = Informer("nodes", nodes_api, node_view, backoff=FAST)
    namespaces = Informer("namespaces", ns_api, namespace_view, backoff=FAST)
    start(nodes, started)
    start(namespaces, started)
    started.append(pods)
    pods.start()
    fallback = FakeFallback()
    reader = CachedClusterReader(FakeCache(pods, nodes, namespaces), fallback)  # type: ignore[arg-type]
    fallbacks = metric("gpu_efficiency_cache_fallback_lists_total", resource="pods")

    state = reader.read()
    assert [p.name for p in state.pods] == ["listed"]  # never an empty cache taken for "no pods"
    assert [n.name for n in state.nodes] == ["n1"]
    assert [n.name for n in state.namespaces] == ["ns"]
    assert state.requests == 16
    assert fallback.calls == ["pods"]
    assert metric("gpu_efficiency_cache_fallback_lists_total", resource="pods") == fallbacks + 1

    pods_api.list_gate.set()
    assert pods.wait_synced(5)
    state = reader.read_pods(reader.read_nodes())
    assert [p.name for p in state.pods] == ["a"]
    assert state.requests == 0
    assert fallback.calls == ["pods"]


def test_reader_feeds_writes_and_evictions_back(started: list[Informer[Any]]) -> None:
    from gpu_efficiency.sources.kube.cluster import namespace_view, node_view

    pods_api, nodes_api, ns_api = FakeListApi([pod("a", "ua", 50)]), FakeListApi([]), FakeListApi([])
    nodes_api.objects = [node_obj("n1", "un1", 5)]
    for api in (pods_api, nodes_api, ns_api):
        api.next_watch()
    pods = start(informer(pods_api), started)
    nodes = start(Informer("nodes", nodes_api, node_view, backoff=FAST), started)
    namespaces = start(Informer("namespaces", ns_api, namespace_view, backoff=FAST), started)
    reader = CachedClusterReader(FakeCache(pods, nodes, namespaces), FakeFallback())  # type: ignore[arg-type]

    reader.pod_written(pod("a", "ua", 60, annotations={"gpuefficiency.io/state": "Idle"}))
    tainted = node_obj("n1", "un1", 7)
    tainted["spec"] = {
        "taints": [{"key": "gpuefficiency.io/gpu-fault", "value": "ecc", "effect": "NoSchedule"}]
    }
    reader.node_written(tainted)
    reader.pod_evicted("ua")
    state = reader.read()
    assert state.pods[0].annotations == {"gpuefficiency.io/state": "Idle"}
    assert state.pods[0].deleting
    assert [t.value for t in state.nodes[0].taints] == ["ecc"]
    assert state == ClusterState(state.pods, state.nodes, state.namespaces, 0)


def _three(pods_api: FakeListApi) -> tuple[Informer[PodView], Informer[Any], Informer[Any]]:
    from gpu_efficiency.sources.kube.cluster import namespace_view, node_view

    nodes_api, ns_api = FakeListApi([node_obj("n1", "un1", 5)]), FakeListApi([ns_obj("ns", 3)])
    for api in (pods_api, nodes_api, ns_api):
        api.next_watch()
    return (
        informer(pods_api),
        Informer("nodes", nodes_api, node_view, backoff=FAST),
        Informer("namespaces", ns_api, namespace_view, backoff=FAST),
    )


def _gated_reader(
    started: list[Informer[Any]], first_sync_wait: float
) -> tuple[threading.Event, FakeFallback, CachedClusterReader]:
    """A started reader whose pods' first LIST is held until the returned gate is set."""
    gate = threading.Event()
    pods_api = FakeListApi([pod("a", "ua", 50)])
    pods_api.list_gate = gate
    pods, nodes, namespaces = _three(pods_api)
    started.extend((pods, nodes, namespaces))
    fallback = FakeFallback()
    reader = CachedClusterReader(
        FakeCache(pods, nodes, namespaces),  # type: ignore[arg-type]
        fallback,  # type: ignore[arg-type]
        first_sync_wait=first_sync_wait,
    )
    reader.start()
    return gate, fallback, reader


def test_right_after_start_a_read_waits_for_the_first_list_instead_of_listing_too(
    started: list[Informer[Any]],
) -> None:
    gate, fallback, reader = _gated_reader(started, first_sync_wait=10)
    threading.Timer(0.2, gate.set).start()
    state = reader.read()
    assert [p.name for p in state.pods] == ["a"]
    assert state.requests == 0
    assert fallback.calls == []


def test_a_first_list_that_takes_too_long_is_not_waited_for(started: list[Informer[Any]]) -> None:
    gate, fallback, reader = _gated_reader(started, first_sync_wait=0.1)
    try:
        state = reader.read()
        assert [p.name for p in state.pods] == ["listed"]
        assert fallback.calls == ["pods"]
    finally:
        gate.set()


def waiting_pod(name: str, uid: str, rv: int) -> dict[str, Any]:
    """A GPU pod the scheduler could not place for lack of GPUs, with a nodeSelector and a toleration."""
    obj = pod(name, uid, rv, gpus=2, node="")
    obj["spec"]["nodeSelector"] = {"gpu": "h100"}
    obj["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    obj["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    return obj


def test_reader_serves_pending_gpu_pods_from_their_informer_and_lists_them_until_synced(
    started: list[Informer[Any]],
) -> None:
    pending_api = FakeListApi([waiting_pod("w", "uw", 40), waiting_pod("cpu-only", "uc", 41)])
    pending_api.objects[1]["spec"]["containers"][0]["resources"] = {}
    pending_api.list_gate = threading.Event()
    pending_api.next_watch()
    pods, nodes, namespaces = _three(FakeListApi([pod("a", "ua", 50)]))
    for each in (pods, nodes, namespaces):
        start(each, started)
    pending = Informer(
        "pending-pods", pending_api, pending_view, keep=lambda v: v.gpu_request > 0, backoff=FAST
    )
    started.append(pending)
    pending.start()
    fallback = FakeFallback()
    reader = CachedClusterReader(FakeCache(pods, nodes, namespaces, pending), fallback)  # type: ignore[arg-type]

    state = reader.read()
    assert [p.name for p in state.pending] == ["waiting"]  # listed: an unsynced cache is not "none waiting"
    assert fallback.calls == ["pending"]

    pending_api.list_gate.set()
    assert pending.wait_synced(5)
    state = reader.read()
    assert state.requests == 0
    [waiting] = state.pending
    assert (waiting.name, waiting.gpu_request, dict(waiting.node_selector)) == ("w", 2, {"gpu": "h100"})
    assert waiting.tolerations == (Toleration("dedicated", "Exists", "", "NoSchedule"),)
    assert waiting_for_gpus(waiting)
    assert [p.name for p in state.pods] == ["a"]  # the pending pod is never judged as a bound one


def with_ip(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["status"]["podIP"] = ip
    return obj


def test_one_informer_of_bound_pods_serves_the_gpu_pods_and_every_address(
    started: list[Informer[Any]],
) -> None:
    """GPU pods and pod addresses are two projections of one LIST and one watch: each is rebuilt
    only when the pods changed, and is None (LIST instead) whenever the informer cannot be read."""
    clock = Clock()
    api = FakeListApi(
        [
            with_ip(pod("b-gpu", "u1", 50), "10.0.0.1"),
            with_ip(pod("cpu", "u2", 51, gpus=0), "10.0.0.2"),
            pod("a-gpu-no-ip", "u3", 52),
            pod("cpu-no-ip", "u4", 53, gpus=0),  # neither part: not held at all
        ]
    )
    bound: Informer[BoundPod] = Informer(
        "pods",
        api,
        bound_pod,
        keep=lambda p: p.gpu is not None or p.address is not None,
        clock=clock,
        max_broken=30.0,
        backoff=Backoff(initial=60, maximum=60),
    )
    gpu_pods = Projection(bound, lambda p: p.gpu, order=lambda v: (v.namespace, v.name))
    addresses = Projection(bound, lambda p: p.address, order=lambda a: a.uid)
    assert gpu_pods.snapshot() is None
    assert addresses.snapshot() is None
    stream = api.next_watch()
    start(bound, started)
    assert gpu_pods.synced
    assert gpu_pods.wait_synced(0)
    assert [v.name for v in gpu_pods.snapshot() or ()] == ["a-gpu-no-ip", "b-gpu"]
    assert addresses.snapshot() == (
        PodAddress("u1", ("10.0.0.1",), "n1"),
        PodAddress("u2", ("10.0.0.2",), "n1"),
    )
    assert len(bound.snapshot() or ()) == 3
    first = gpu_pods.snapshot()
    assert gpu_pods.snapshot() is first  # nothing changed: the same tuple, no pass over the pods

    stream.put(event("MODIFIED", with_ip(pod("cpu", "u2", 60, gpus=0), "10.0.0.9")))
    wait_until(lambda: PodAddress("u2", ("10.0.0.9",), "n1") in (addresses.snapshot() or ()))
    assert gpu_pods.snapshot() is first  # a pod without GPUs moved: the GPU pods read the same
    stream.put(
        event(
            "MODIFIED",
            with_ip(pod("b-gpu", "u1", 61, annotations={"gpuefficiency.io/state": "Idle"}), "10.0.0.1"),
        )
    )
    wait_until(lambda: gpu_pods.snapshot() != first)
    assert [v.annotations for v in gpu_pods.snapshot() or ()] == [{}, {"gpuefficiency.io/state": "Idle"}]

    errors = metric("gpu_efficiency_cache_watch_restarts_total", resource="pods", reason="error")
    stream.fail(ConnectionResetError("reset"))
    wait_until(
        lambda: metric("gpu_efficiency_cache_watch_restarts_total", resource="pods", reason="error") > errors
    )
    clock.now += 31
    assert gpu_pods.snapshot() is None
    assert addresses.snapshot() is None
