"""Tell the workloads: a pod on a GPU held faulty gets an annotation and an event naming the fault.

Its owner then knows why the job died or slowed without reading node conditions. The annotation
``gpuefficiency.io/gpu-fault`` is canonical JSON (kind, XID code, meaning and NVIDIA's action for
XIDs, the fault's value otherwise, node, GPU, since), so an unchanged fault makes no write; it is
removed, with a Normal event, once the GPU is no longer held faulty. Pods are matched to GPUs by
the metrics' pod labels, so without metrics nothing is added, and a pod's annotation is removed
only when its node holds no fault at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from gpu_efficiency.api.names import EV_POD_GPU_FAULT, POD_GPU_FAULT
from gpu_efficiency.engine.model import Action, AnnotatePod, GPUSample, PodEvent, PodView
from gpu_efficiency.engine.quarantine.record import FaultEntry, GpuFault, kind_order
from gpu_efficiency.engine.quarantine.xid_catalogue import ACTIONS as XID_ACTIONS
from gpu_efficiency.engine.quarantine.xid_catalogue import CATALOGUE, resolution


def fault_note(node: str, kind: str, entry: FaultEntry, gpu: GpuFault) -> str:
    """The annotation value for a pod on ``gpu``."""
    note: dict[str, object] = {"kind": kind, "node": node, "gpu": gpu.label, "since": entry.since}
    if kind == "xid" and "xid" in gpu.fingerprint:
        code = int(gpu.fingerprint["xid"])
        known = CATALOGUE.get(code)
        note["code"] = code
        note["meaning"] = known.meaning if known is not None else "not in the operator's XID catalogue"
        note["action"] = XID_ACTIONS[resolution(code)]
    else:
        note["value"] = gpu.value
    return json.dumps(note, sort_keys=True, separators=(",", ":"))


def _faulty_gpus(held: Mapping[str, Mapping[str, FaultEntry]]) -> dict[str, str]:
    """GPU UUID -> annotation value, the worst kind first when a GPU has several."""
    out: dict[str, str] = {}
    for node, entries in held.items():
        for kind in sorted(entries, key=kind_order):
            entry = entries[kind]
            for gpu in entry.gpus:
                out.setdefault(gpu.uuid, fault_note(node, kind, entry, gpu))
    return out


def workload_actions(
    held: Mapping[str, Mapping[str, FaultEntry]],
    gpus: Iterable[GPUSample],
    pods: Sequence[PodView],
    *,
    data_ok: bool,
) -> list[Action]:
    """Annotations and events for pods whose GPU became faulty or recovered.

    ``held``: every in-scope node's held faults (kind -> entry), after this cycle's decisions;
    nodes not in it are out of scope and their pods are left alone.
    """
    faulty = _faulty_gpus(held)
    on_gpu: dict[tuple[str, str], str] = {}
    if data_ok:
        for gpu in gpus:
            if gpu.uuid in faulty:
                for ref in gpu.pods:
                    on_gpu.setdefault((ref.namespace, ref.name), faulty[gpu.uuid])
    actions: list[Action] = []
    for pod in pods:
        if pod.node not in held:
            continue
        current = pod.annotations.get(POD_GPU_FAULT)
        desired = on_gpu.get((pod.namespace, pod.name))
        if desired is not None and desired != current:
            note = json.loads(desired)
            what = (
                f"XID {note['code']}: {note['meaning']}"
                if "code" in note
                else f"{note['kind']} {note['value']}"
            )
            message = f"the pod's GPU {note['gpu']} on node {note['node']} is faulty ({what})"
            if "action" in note:
                message += f"; NVIDIA's advice: {note['action']}"
            actions.append(
                AnnotatePod(
                    namespace=pod.namespace, name=pod.name, uid=pod.uid, annotations={POD_GPU_FAULT: desired}
                )
            )
            actions.append(
                PodEvent(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    reason=EV_POD_GPU_FAULT,
                    message=message,
                    type="Warning",
                )
            )
        elif desired is None and current is not None and (data_ok or not held[pod.node]):
            actions.append(
                AnnotatePod(
                    namespace=pod.namespace, name=pod.name, uid=pod.uid, annotations={POD_GPU_FAULT: None}
                )
            )
            message = (
                "the GPU fault this pod ran into is no longer held: the GPU is recovered or the pod moved"
            )
            actions.append(
                PodEvent(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    reason=EV_POD_GPU_FAULT,
                    message=message,
                    type="Normal",
                )
            )
    return actions
