"""The cluster as the long-running operator reads it: pods, nodes and namespaces kept by watches.

One ``ClusterCache`` (four informers, ``sources/kube/watch.py``) is shared by every policy's cycle and
started on every replica, leader or not, so a failover starts warm. ``CachedClusterReader`` has
``ClusterReader``'s interface: a steady cycle reads three immutable snapshots and makes no API
request (``requests`` == 0), where the LIST path made one per 500 pods. A resource whose cache is
not usable yet (first LIST not done) or any more (watch broken longer than ``max_broken``) is
LISTed for that cycle instead, so a cycle never takes an empty or stale cache for "no pods".

Read-your-writes: the objects our own PATCHes return are fed back (``pod_written``,
``node_written``) and an evicted pod is marked deleting (``pod_evicted``), so the next cycle does
not re-plan a write, or an eviction, whose watch event has not arrived yet.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from kubernetes import client

from gpu_efficiency import metrics
from gpu_efficiency.engine.model import NamespaceView, NodeView, PendingPod, PodView
from gpu_efficiency.sources.kube.cluster import (
    PENDING_FIELD_SELECTOR,
    POD_FIELD_SELECTOR,
    ClusterReader,
    ClusterState,
    namespace_view,
    node_view,
    pending_view,
    pod_address,
    pod_view,
)
from gpu_efficiency.sources.kube.watch import Informer, InformerSet, Projection
from gpu_efficiency.sources.metrics.targets import PodAddress

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Objects per page of the informers' LISTs. Smaller than the per-cycle LIST's 500: a relist runs
#: once, not every cycle, and a page is held decoded (~10x its JSON) next to the views the cache
#: keeps. At 8,000 pods and 1,000 nodes, 100 a page took the operator's RSS after the first sync
#: from 115 to 94 MiB (measured in a bare process; 50 a page: 91 MiB).
CACHE_PAGE_SIZE = 100


@dataclasses.dataclass(frozen=True, slots=True)
class BoundPod:
    """One pod on a node as the cache keeps it: its GPU view (None: it requests no GPU) and its
    address (None: no IP, or finished). Both are read from one LIST and one watch of the pods."""

    gpu: PodView | None
    address: PodAddress | None


def bound_pod(obj: Mapping[str, Any]) -> BoundPod:
    view, address = pod_view(obj), pod_address(obj)
    return BoundPod(view if view.gpu_request > 0 else None, address if address.ips else None)


def _kept(pod: BoundPod) -> bool:
    return pod.gpu is not None or pod.address is not None


def _gpu(pod: BoundPod) -> PodView | None:
    return pod.gpu


def _address(pod: BoundPod) -> PodAddress | None:
    return pod.address


def _pod_order(view: PodView) -> tuple[str, str]:
    return (view.namespace, view.name)


def _pending_order(view: PendingPod) -> tuple[str, str]:
    return (view.namespace, view.name)


def _name(view: NodeView | NamespaceView) -> str:
    return view.name


def _deleting(pod: BoundPod) -> BoundPod:
    return (
        pod if pod.gpu is None else dataclasses.replace(pod, gpu=dataclasses.replace(pod.gpu, deleting=True))
    )


class ClusterCache(InformerSet):
    """Informers for the pods on nodes, GPU pods pending, nodes and namespaces, started and stopped
    together.

    The pods on nodes are listed and watched once and read twice: ``pods`` (those that request GPUs,
    the cycle's subjects) and ``addresses`` (every live pod's IP and node, for the scrape targets'
    addresses: ``sources/metrics/targets.py``). Two informers of the same field selector listed,
    decoded and watched every pod twice, and a restart's first cycle waits for both LISTs.
    """

    def __init__(self, api_client: client.ApiClient, **options: Any) -> None:
        core = client.CoreV1Api(api_client)
        options.setdefault("page_size", CACHE_PAGE_SIZE)
        #: The pods on nodes; the resource keeps the name "pods" in the cache's metrics.
        self.bound: Informer[BoundPod] = Informer(
            "pods",
            partial(core.list_pod_for_all_namespaces, field_selector=POD_FIELD_SELECTOR),
            bound_pod,
            keep=_kept,
            **options,
        )
        self.pods: Projection[BoundPod, PodView] = Projection(self.bound, _gpu, order=_pod_order)
        self.addresses: Projection[BoundPod, PodAddress] = Projection(
            self.bound, _address, order=lambda v: v.uid
        )
        self.pending: Informer[PendingPod] = Informer(
            "pending-pods",
            partial(core.list_pod_for_all_namespaces, field_selector=PENDING_FIELD_SELECTOR),
            pending_view,
            keep=lambda v: v.gpu_request > 0,
            order=_pending_order,
            **options,
        )
        self.nodes: Informer[NodeView] = Informer("nodes", core.list_node, node_view, order=_name, **options)
        self.namespaces: Informer[NamespaceView] = Informer(
            "namespaces", core.list_namespace, namespace_view, order=_name, **options
        )

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (self.bound, self.pending, self.nodes, self.namespaces)

    def pod_written(self, obj: Mapping[str, Any]) -> None:
        self.bound.observe_written(obj)

    def pod_evicted(self, uid: str) -> None:
        self.bound.update(uid, _deleting)


class CachedClusterReader:
    """``ClusterReader``'s interface over a ``ClusterCache``, LISTing what the cache cannot serve.

    In the first ``first_sync_wait`` seconds after ``start`` a read waits for the cache's first LIST
    rather than make one of its own alongside it (the first cycle starts as soon as a policy is
    seen, usually before a cache of thousands of pods has synced).
    """

    def __init__(
        self,
        cache: ClusterCache,
        fallback: ClusterReader,
        *,
        first_sync_wait: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.fallback = fallback
        self.first_sync_wait = first_sync_wait
        self._clock = clock
        self._started_at: float | None = None

    def start(self) -> None:
        self._started_at = self._clock()
        self.cache.start()

    def _snapshot(self, informer: Informer[T] | Projection[Any, T]) -> tuple[T, ...] | None:
        if not informer.synced and self._started_at is not None:
            left = self._started_at + self.first_sync_wait - self._clock()
            if left > 0:
                informer.wait_synced(left)
        return informer.snapshot()

    def stop(self) -> None:
        self.cache.stop()

    def read(self) -> ClusterState:
        return self.read_pods(self.read_nodes())

    def read_nodes(self) -> ClusterState:
        """Nodes and namespaces (``pods`` empty), from the cache where it is usable."""
        requests = 0
        nodes = self._snapshot(self.cache.nodes)
        if nodes is None:
            nodes, calls = self.fallback.list_nodes()
            requests += self._fell_back("nodes", calls)
        namespaces = self._snapshot(self.cache.namespaces)
        if namespaces is None:
            namespaces, calls = self.fallback.list_namespaces()
            requests += self._fell_back("namespaces", calls)
        addresses = self._snapshot(self.cache.addresses)
        if addresses is None:
            addresses, calls = self.fallback.list_pod_addresses()
            requests += self._fell_back("pod-addresses", calls)
        return ClusterState(
            pods=(), nodes=nodes, namespaces=namespaces, requests=requests, pod_addresses=addresses
        )

    def read_pods(self, state: ClusterState) -> ClusterState:
        """``state`` with the GPU pods added."""
        requests = state.requests
        pods = self._snapshot(self.cache.pods)
        if pods is None:
            pods, calls = self.fallback.list_pods()
            requests += self._fell_back("pods", calls)
        pending = self._snapshot(self.cache.pending)
        if pending is None:
            pending, calls = self.fallback.list_pending()
            requests += self._fell_back("pending-pods", calls)
        return ClusterState(
            pods=pods,
            nodes=state.nodes,
            namespaces=state.namespaces,
            requests=requests,
            pending=pending,
            pod_addresses=state.pod_addresses,
        )

    @staticmethod
    def _fell_back(resource: str, calls: int) -> int:
        metrics.CACHE_FALLBACKS.labels(resource).inc()
        log.info("%s: cache not synced or its watch broken: listed instead (%d requests)", resource, calls)
        return calls

    def pod_written(self, obj: Mapping[str, Any]) -> None:
        self.cache.pod_written(obj)

    def node_written(self, obj: Mapping[str, Any]) -> None:
        self.cache.nodes.observe_written(obj)

    def pod_evicted(self, uid: str) -> None:
        self.cache.pod_evicted(uid)
