"""Kubernetes events on pods, nodes and policies (core/v1, so `kubectl describe` shows them).

The engine emits an event only on a state change, so each one is created once; the name carries a
hash of its content so a retried write after a crash cannot create a duplicate.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api.policy import GROUP, KIND, VERSION

#: Cluster-scoped objects (nodes, policies) get their events in this namespace, as kubelet does.
CLUSTER_EVENTS_NAMESPACE = "default"
COMPONENT = "gpu-efficiency-operator"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    name: str
    uid: str = ""
    namespace: str = ""
    api_version: str = "v1"


def policy_ref(name: str, uid: str) -> ObjectRef:
    return ObjectRef(kind=KIND, name=name, uid=uid, api_version=f"{GROUP}/{VERSION}")


def node_ref(name: str) -> ObjectRef:
    # kubelet uses the node name as uid for node events; kubectl describe node matches on it.
    return ObjectRef(kind="Node", name=name, uid=name)


def pod_ref(namespace: str, name: str, uid: str) -> ObjectRef:
    return ObjectRef(kind="Pod", name=name, uid=uid, namespace=namespace)


class EventRecorder:
    def __init__(self, api_client: client.ApiClient, instance: str | None = None) -> None:
        self.core = client.CoreV1Api(api_client)
        self.instance = instance or socket.gethostname()

    def record(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        """Create the event; an AlreadyExists (same content, retried) is success."""
        namespace = ref.namespace or CLUSTER_EVENTS_NAMESPACE
        now = datetime.now(UTC)
        digest = hashlib.sha1(f"{ref.uid}|{reason}|{message}|{now:%Y%m%d%H%M}".encode()).hexdigest()[:10]
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{ref.name}.{digest}", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version=ref.api_version,
                kind=ref.kind,
                name=ref.name,
                uid=ref.uid or None,
                namespace=ref.namespace or None,
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=f"{GROUP}/operator",
            reporting_instance=self.instance,
            action=reason,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
