"""Read GPU identity and pod attribution from exporter labels, whatever their spelling.

The node comes from ``hostname`` (dcgm-exporter since #655), ``Hostname`` (before) or what a scrape
config adds (``kubernetes_node``, ``node``, ``nodename``).

dcgm-exporter writes ``pod``/``namespace``/``container``; Prometheus with ``honorLabels: false``
renames them ``exported_pod``/...; old exporters used ``pod_name``/``pod_namespace``. All are accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.api.exporter_fields import NODE_LABELS
from gpu_efficiency.engine.model import PodRef

_POD_VARIANTS = (
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
    ("pod_name", "pod_namespace", "container_name"),
)
#: dcgm-exporter's ``hostname`` (since NVIDIA/dcgm-exporter #655) and ``Hostname`` (before), then
#: what a scrape config adds (``api/exporter_fields.py`` NODE_LABELS).
_NODE_LABELS = NODE_LABELS


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


#: What a GPU identifier may look like: NVML's ``GPU-<hex 8-4-4-4-12>`` and ``MIG-<hex ...>``, the
#: legacy ``MIG-GPU-<uuid>/<gi>/<ci>``, and the short ``GPU-<name>`` of simulators: ``GPU-`` or
#: ``MIG-`` then ASCII letters, digits and ``-_.:/``, at most 128 characters. Anything else (a
#: newline, a quote, a backslash, non-ASCII) is not a GPU and would only break the PromQL it is
#: listed in (issue 19, finding 6).
_UUID_SHAPE = re.compile(r"(?:GPU|MIG)-[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}", re.ASCII)
_INSTANCE_SHAPE = re.compile(r"[0-9]{0,9}", re.ASCII)


def valid_uuid(text: str) -> bool:
    """Is ``text`` shaped like a GPU or MIG identifier (see ``_UUID_SHAPE``)?"""
    return _UUID_SHAPE.fullmatch(text) is not None


def valid_key(uuid: str, instance_id: str) -> bool:
    """A well-formed GPU identifier and MIG GPU-instance id (digits, or '' for a whole GPU)."""
    return valid_uuid(uuid) and _INSTANCE_SHAPE.fullmatch(instance_id) is not None


def raw_key_of(labels: Mapping[str, str]) -> GPUKey | None:
    """The GPU a series names, as written (None: it names none)."""
    uuid = labels.get("UUID") or labels.get("uuid") or ""
    return GPUKey(uuid=uuid, instance_id=labels.get("GPU_I_ID", "")) if uuid else None
