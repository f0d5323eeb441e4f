"""Read the cluster's GPU pods, nodes and namespaces into the engine's plain views.

Four LISTs per cycle (paged, 500 objects a page), decoded with orjson straight from the wire
(the kubernetes client's own model deserialisation costs ~10x more at thousands of pods) and turned
into views page by page. Pods on nodes are listed (``spec.nodeName!=``), and only those
requesting GPUs are kept; GPU pods not bound yet are listed apart (``pending_view``: what the
scheduler matches them by), for ``reclaimWhen: OnPressure`` and the reclamation records. A view keeps only our own annotations (``gpuefficiency.io/``): the engine
reads no other, and the watch cache holds every view between cycles, where a pod's foreign
annotations (``kubectl.kubernetes.io/last-applied-configuration`` alone is often kilobytes) would
cost more than the rest of its view. Nodes can be read first (``read_nodes``) so that the metrics fetch, which
needs them, runs while the pods are listed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from kubernetes import client

from gpu_efficiency.api.names import GPU_RESOURCE
from gpu_efficiency.api.policy import PREFIX
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine.model import (
    NamespaceView,
    NodeCondition,
    NodeRequirement,
    NodeView,
    OwnerRef,
    PendingPod,
    PodView,
    Taint,
    Toleration,
)
from gpu_efficiency.objects.dra import fault_tolerations
from gpu_efficiency.sources.metrics.targets import PodAddress

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: Only pods bound to a node (a pending pod holds no GPU).
POD_FIELD_SELECTOR = "spec.nodeName!="
#: Pods not bound to a node yet: the demand ``reclaimWhen: OnPressure`` reclaims for.
PENDING_FIELD_SELECTOR = "spec.nodeName=,status.phase=Pending"
T = TypeVar("T")


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _gpu_request(spec: Mapping[str, Any]) -> int:
    """GPUs a pod holds: the sum over containers (init containers run before, so their max)."""

    def amount(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        return _quantity(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)))

    regular = sum(amount(c) for c in spec.get("containers") or ())
    init = max((amount(c) for c in spec.get("initContainers") or ()), default=0)
    return max(regular, init)


def _dra_claims(spec: Mapping[str, Any]) -> int:
    """A pod's ResourceClaims its containers use (DRA): it is then a GPU pod, one GPU per claim at
    least (how many devices a claim holds is in the claim, not read). A claim for something other
    than a GPU brings no GPU samples, so such a pod is judged Unknown, never acted on."""
    used = {
        str(c.get("name"))
        for container in spec.get("containers") or ()
        for c in (container.get("resources") or {}).get("claims") or ()
    }
    return sum(1 for claim in spec.get("resourceClaims") or () if str(claim.get("name")) in used)


def own_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The ``gpuefficiency.io/`` annotations only: all the engine reads (see the module docstring)."""
    return {k: v for k, v in annotations.items() if k.startswith(PREFIX)}


def pod_view(obj: Mapping[str, Any]) -> PodView:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    controller = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    annotations = meta.get("annotations") or {}
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or "",
        phase=status.get("phase") or "",
        labels=meta.get("labels") or {},
        annotations=own_annotations(annotations),
        controller_kind=controller.get("kind") if controller else None,
        priority=int(spec.get("priority") or 0),
        start_time=parse_rfc3339(status.get("startTime")),
        gpu_request=_gpu_request(spec) or _dra_claims(spec),
        is_static=MIRROR_ANNOTATION in annotations,
        deleting=bool(meta.get("deletionTimestamp")),
        fault_tolerations=fault_tolerations(spec.get("tolerations")),
        controller=OwnerRef(
            controller.get("apiVersion", ""),
            controller.get("kind", ""),
            controller.get("name", ""),
            controller.get("uid", ""),
        )
        if controller
        else None,
    )


def _requirements(items: Any, field: bool) -> tuple[NodeRequirement, ...]:
    return tuple(
        NodeRequirement(
            str(e.get("key", "")),
            str(e.get("operator", "")),
            tuple(str(v) for v in e.get("values") or ()),
            field,
        )
        for e in items or ()
    )


def pending_view(obj: Mapping[str, Any]) -> PendingPod:
    """A pod not bound to a node: its GPU request and what the scheduler matches nodes by."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    scheduled: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), {}
    )
    unreadable = ""
    terms: tuple[tuple[NodeRequirement, ...], ...] = ()
    try:
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = tuple(
            _requirements(t.get("matchExpressions"), False) + _requirements(t.get("matchFields"), True)
            for t in required.get("nodeSelectorTerms") or ()
        )
        selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
        tolerations = tuple(
            Toleration(
                str(t.get("key") or ""),
                str(t.get("operator") or "Equal"),
                str(t.get("value") or ""),
                str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or ()
        )
    except (AttributeError, TypeError) as exc:
        unreadable, selector, tolerations = f"its scheduling constraints could not be read: {exc}", {}, ()
    return PendingPod(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        gpu_request=_gpu_request(spec),
        priority=int(spec.get("priority") or 0),
        created=parse_rfc3339(meta.get("creationTimestamp")),
        node_selector=selector,
        affinity_terms=terms,
        tolerations=tolerations,
        scheduled_reason=(scheduled.get("reason") or "") if scheduled.get("status") == "False" else "",
        scheduled_message=(scheduled.get("message") or "") if scheduled.get("status") == "False" else "",
        unreadable=unreadable,
    )


def node_view(obj: Mapping[str, Any]) -> NodeView:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    return NodeView(
        name=meta.get("name", ""),
        labels=meta.get("labels") or {},
        annotations=own_annotations(meta.get("annotations") or {}),
        taints=tuple(
            Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect", ""))
            for t in spec.get("taints") or ()
        ),
        conditions=tuple(
            NodeCondition(
                type=c.get("type", ""),
                status=c.get("status", ""),
                reason=c.get("reason") or "",
                message=c.get("message") or "",
                last_transition_time=c.get("lastTransitionTime") or "",
            )
            for c in status.get("conditions") or ()
        ),
        gpu_capacity=_quantity(capacity.get(GPU_RESOURCE, 0)),
        unschedulable=bool(spec.get("unschedulable")),
        gpu_allocatable=_quantity(allocatable[GPU_RESOURCE]) if GPU_RESOURCE in allocatable else None,
        addresses=tuple(
            sorted({str(a.get("address")) for a in status.get("addresses") or () if a.get("address")})
        ),
    )


#: Phases of a pod that holds its IP (a finished pod's IP may already be another pod's).
_LIVE_PHASES = ("Pending", "Running")


def pod_address(obj: Mapping[str, Any]) -> PodAddress:
    """A pod's IPs and node (no IP once it has finished): where its scrape target runs."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ips = [str(status.get("podIP") or ""), *(str(p.get("ip") or "") for p in status.get("podIPs") or ())]
    live = status.get("phase") in _LIVE_PHASES and not meta.get("deletionTimestamp")
    return PodAddress(
        uid=meta.get("uid", ""),
        ips=tuple(ip for ip in dict.fromkeys(ips) if ip) if live else (),
        node=spec.get("nodeName") or "",
    )


@dataclass(frozen=True, slots=True)
class ClusterState:
    pods: tuple[PodView, ...]
    nodes: tuple[NodeView, ...]
    namespaces: tuple[NamespaceView, ...]
    requests: int  # API calls made to read it
    pending: tuple[PendingPod, ...] = ()  # GPU pods not bound to a node yet
    #: Every live pod's IP and node (read with the nodes): where a scrape target at that IP runs.
    pod_addresses: tuple[PodAddress, ...] = ()


class ClusterSource(Protocol):
    """What a cycle reads the cluster through: ``ClusterReader`` (LIST) or the watch cache."""

    def read(self) -> ClusterState: ...
    def read_nodes(self) -> ClusterState: ...
    def read_pods(self, state: ClusterState) -> ClusterState: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...

    def pod_written(self, obj: Mapping[str, Any]) -> None:
        """A pod as our own PATCH returned it (read-your-writes)."""

    def node_written(self, obj: Mapping[str, Any]) -> None:
        """A node as our own PATCH returned it (read-your-writes)."""

    def pod_evicted(self, uid: str) -> None:
        """Our eviction of this pod succeeded: it is being deleted."""


class ClusterReader:
    """Lists what one cycle needs. Pages through large lists with ``limit``/``continue``, turning
    each page into views before the next is read (a page of 500 raw pods is ~15 MB of Python objects;
    8,000 held at once were ~250 MB)."""

    def __init__(self, api_client: client.ApiClient, page_size: int = 500) -> None:
        self.core = client.CoreV1Api(api_client)
        self.page_size = page_size

    def _list(self, method: Any, view: Callable[[dict[str, Any]], T], **kwargs: Any) -> tuple[list[T], int]:
        out: list[T] = []
        token, calls = None, 0
        while True:
            response = method(limit=self.page_size, _continue=token, _preload_content=False, **kwargs)
            calls += 1
            doc = orjson.loads(response.data)
            out.extend(map(view, doc.get("items") or ()))
            token = (doc.get("metadata") or {}).get("continue")
            del doc
            if not token:
                return out, calls

    def list_nodes(self) -> tuple[tuple[NodeView, ...], int]:
        nodes, calls = self._list(self.core.list_node, node_view)
        return tuple(nodes), calls

    def list_namespaces(self) -> tuple[tuple[NamespaceView, ...], int]:
        namespaces, calls = self._list(self.core.list_namespace, namespace_view)
        return tuple(namespaces), calls

    def list_pods(self) -> tuple[tuple[PodView, ...], int]:
        """Pods on nodes that request GPUs (the only ones a policy can judge)."""
        pods, calls = self._list(
            self.core.list_pod_for_all_namespaces, pod_view, field_selector=POD_FIELD_SELECTOR
        )
        return tuple(v for v in pods if v.gpu_request > 0), calls

    def list_pending(self) -> tuple[tuple[PendingPod, ...], int]:
        """GPU pods not bound to a node yet (one page in a healthy cluster)."""
        pods, calls = self._list(
            self.core.list_pod_for_all_namespaces, pending_view, field_selector=PENDING_FIELD_SELECTOR
        )
        return tuple(v for v in pods if v.gpu_request > 0), calls

    def read(self) -> ClusterState:
        return self.read_pods(self.read_nodes())

    def list_pod_addresses(self) -> tuple[tuple[PodAddress, ...], int]:
        """Every live pod's IPs and node (the scrape targets' addresses: ``sources/metrics/targets.py``)."""
        pods, calls = self._list(
            self.core.list_pod_for_all_namespaces, pod_address, field_selector=POD_FIELD_SELECTOR
        )
        return tuple(p for p in pods if p.ips), calls

    def read_nodes(self) -> ClusterState:
        """Nodes, namespaces and the pods' addresses (``pods`` empty): what the metrics fetch needs
        to start."""
        nodes, c1 = self.list_nodes()
        namespaces, c2 = self.list_namespaces()
        addresses, c3 = self.list_pod_addresses()
        return ClusterState(
            pods=(), nodes=nodes, namespaces=namespaces, requests=c1 + c2 + c3, pod_addresses=addresses
        )

    def read_pods(self, state: ClusterState) -> ClusterState:
        """``state`` with the GPU pods (bound and pending) added."""
        pods, calls = self.list_pods()
        pending, more = self.list_pending()
        return ClusterState(
            pods=pods,
            nodes=state.nodes,
            namespaces=state.namespaces,
            requests=state.requests + calls + more,
            pending=pending,
            pod_addresses=state.pod_addresses,
        )

    # A LIST each cycle reads everything fresh: nothing to start, and our writes are read back.
    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def pod_written(self, obj: Mapping[str, Any]) -> None:
        """The next LIST reads it back."""

    def node_written(self, obj: Mapping[str, Any]) -> None:
        """The next LIST reads it back."""

    def pod_evicted(self, uid: str) -> None:
        """The next LIST shows it deleting, or gone."""


def namespace_view(obj: Mapping[str, Any]) -> NamespaceView:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return NamespaceView(
        name=meta.get("name", ""),
        labels=meta.get("labels") or {},
        annotations={k: v for k, v in annotations.items() if k.startswith(PREFIX)},
    )
