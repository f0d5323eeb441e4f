"""Prometheus text format 0.0.4 as dcgm-exporter writes it: labels, their variants, value formatting.

Label strings are built once per GPU and attribution change; a scrape is then one pass of string
concatenation and a single join.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Final

from gpu_efficiency_sim.allocation import Holder

#: A value as served: a number, or "NaN"/"+Inf"/"-Inf" spelt out.
Reading = float | str

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: The exporter's own identity, which Prometheus attaches as pod/namespace/container when it scrapes
#: through pod service discovery with honor_labels false; the workload's labels then arrive as
#: exported_pod/exported_namespace/exported_container.
EXPORTER_POD: Final = "nvidia-dcgm-exporter-sim"
EXPORTER_NAMESPACE: Final = "gpu-operator"
EXPORTER_CONTAINER: Final = "nvidia-dcgm-exporter"


class PodLabels(StrEnum):
    STANDARD = "standard"  # pod, namespace, container
    EXPORTED = "exported"  # exported_pod, ... plus the exporter's own pod/namespace/container
    LEGACY = "legacy"  # pod_name, pod_namespace, container_name (old exporters)
    NONE = "none"  # no Kubernetes mapping


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def gpu_labels(
    *,
    index: int,
    uuid: str,
    pci_bus_id: str,
    model_name: str,
    hostname: str,
    driver_version: str,
    holder: Holder | None,
    pod_labels: PodLabels,
    node_label: str = "Hostname",
) -> str:
    """The label set of one GPU's series (without braces), in dcgm-exporter's order.

    ``node_label``: ``Hostname`` up to dcgm-exporter 4.8.2, ``hostname`` from 4.8.3 (``generations``)."""
    parts = [
        f'gpu="{index}"',
        f'UUID="{uuid}"',
        f'pci_bus_id="{pci_bus_id}"',
        f'device="nvidia{index}"',
        f'modelName="{escape(model_name)}"',
        f'{node_label}="{escape(hostname)}"',
    ]
    if driver_version:
        parts.append(f'DCGM_FI_DRIVER_VERSION="{escape(driver_version)}"')
    if pod_labels is PodLabels.EXPORTED:
        parts += [
            f'container="{EXPORTER_CONTAINER}"',
            f'namespace="{EXPORTER_NAMESPACE}"',
            f'pod="{EXPORTER_POD}"',
        ]
    if holder is not None and pod_labels is not PodLabels.NONE:
        c, ns, pod = {
            PodLabels.STANDARD: ("container", "namespace", "pod"),
            PodLabels.EXPORTED: ("exported_container", "exported_namespace", "exported_pod"),
            PodLabels.LEGACY: ("container_name", "pod_namespace", "pod_name"),
        }[pod_labels]
        parts += [
            f'{c}="{escape(holder.container)}"',
            f'{ns}="{escape(holder.pod.namespace)}"',
            f'{pod}="{escape(holder.pod.name)}"',
        ]
    return ",".join(parts)


def format_value(value: float) -> str:
    """Integers without decimals (as the exporter prints integer fields), NaN and infinities spelt out."""
    if type(value) is int:
        return str(value)
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def header(name: str, metric_type: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {metric_type}\n"
