"""Read GPU identity and pod attribution from exporter labels, whatever their spelling.

dcgm-exporter writes ``pod``/``namespace``/``container``; Prometheus with ``honorLabels: false``
renames them ``exported_pod``/...; old exporters used ``pod_name``/``pod_namespace``. All are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.engine.model import PodRef

_POD_VARIANTS = (
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
    ("pod_name", "pod_namespace", "container_name"),
)
_NODE_LABELS = ("Hostname", "kubernetes_node", "node", "nodename")


def pod_of(labels: Mapping[str, str]) -> PodRef | None:
    """The pod a series is attributed to, or None for an unallocated GPU.

    ``exported_*`` wins over ``pod``: with honorLabels false, ``pod`` names the exporter's own pod.
    """
    for pod_key, ns_key, container_key in _POD_VARIANTS:
        pod, namespace = labels.get(pod_key, ""), labels.get(ns_key, "")
        if pod and namespace:
            return PodRef(namespace=namespace, name=pod, container=labels.get(container_key, ""))
    return None


def node_of(labels: Mapping[str, str]) -> str:
    for key in _NODE_LABELS:
        value = labels.get(key, "")
        if value:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class GPUKey:
    uuid: str
    instance_id: str  # MIG GPU instance id, "" for a whole GPU

    @property
    def id(self) -> str:
        return f"{self.uuid}/{self.instance_id}" if self.instance_id else self.uuid


def key_of(labels: Mapping[str, str]) -> GPUKey | None:
    uuid = labels.get("UUID") or labels.get("uuid") or ""
    return GPUKey(uuid=uuid, instance_id=labels.get("GPU_I_ID", "")) if uuid else None
