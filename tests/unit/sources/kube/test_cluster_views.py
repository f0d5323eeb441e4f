"""The engine's views of pods and nodes, as the LIST path and the watch cache both build them."""

from __future__ import annotations

from typing import Any

from gpu_efficiency.api import names
from gpu_efficiency.sources.kube.cluster import MIRROR_ANNOTATION, node_view, pod_view

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ml",
            "name": "trainer-0",
            "uid": "u-1",
            "labels": {"app": "trainer", "team": "vision"},
            "annotations": annotations,
            "ownerReferences": [{"kind": "StatefulSet", "controller": True}],
        },
        "spec": {
            "nodeName": "gpu-1",
            "priority": 10,
            "containers": [{"resources": {"limits": {names.GPU_RESOURCE: "2"}}}],
        },
        "status": {"phase": "Running", "startTime": "2026-11-22T00:00:00Z"},
    }


def test_a_pod_view_keeps_our_annotations_and_every_label_but_drops_foreign_annotations() -> None:
    view = pod_view(
        _pod(
            {
                LAST_APPLIED: "{" + "x" * 4000 + "}",
                "sim.gpuefficiency.io/profile": "idle",  # another group that merely ends like ours
                names.STATE: "Idle",
                names.IDLE_SINCE: "2026-11-22T00:01:00Z",
                names.KEEP_UNTIL: "2026-11-23T00:00:00Z",
            }
        )
    )
    assert dict(view.annotations) == {
        names.STATE: "Idle",
        names.IDLE_SINCE: "2026-11-22T00:01:00Z",
        names.KEEP_UNTIL: "2026-11-23T00:00:00Z",
    }
    assert dict(view.labels) == {"app": "trainer", "team": "vision"}
    assert (view.gpu_request, view.controller_kind, view.priority) == (2, "StatefulSet", 10)
    assert not view.is_static


def test_a_mirror_pod_is_still_recognised_after_its_annotation_is_dropped() -> None:
    view = pod_view(_pod({MIRROR_ANNOTATION: "abc"}))
    assert view.is_static
    assert dict(view.annotations) == {}


def test_a_node_view_keeps_only_our_annotations() -> None:
    view = node_view(
        {
            "metadata": {
                "name": "gpu-1",
                "labels": {"nvidia.com/gpu.product": "H100"},
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    names.NODE_FAULTS: '{"ecc": {}}',
                    names.FAULT_RECOVERED: "ecc",
                },
            },
            "spec": {"taints": [{"key": names.FAULT_TAINT_KEY, "value": "ecc", "effect": "NoSchedule"}]},
            "status": {"capacity": {names.GPU_RESOURCE: "8"}},
        }
    )
    assert dict(view.annotations) == {names.NODE_FAULTS: '{"ecc": {}}', names.FAULT_RECOVERED: "ecc"}
    assert dict(view.labels) == {"nvidia.com/gpu.product": "H100"}
    assert (view.gpu_capacity, len(view.taints)) == (8, 1)
