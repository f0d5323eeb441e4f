"""The DeviceTaintRules and ResourceSlices single-GPU quarantine reads and writes, as plain data.

Shared by the source that reads them (``sources/kube/dra``) and the actuator that writes our rules
(``actuators/devices``), which may not import each other. A device counts as a GPU when its slice
gives it a ``uuid`` attribute (NVIDIA's DRA driver does; a driver-qualified ``<driver>/uuid`` too),
which is how the metrics name the GPU; only the newest generation of each pool is read (older
slices are being replaced). Our rules select one device each by driver, pool and name, carry our
taint key with the fault kind as value, the managed-by label and the node in an annotation.
ResourceClaims say which pods hold which device (``parse_claims``): what a drain evicts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_efficiency.api.names import (
    DEVICE_RULE_GPU,
    DEVICE_RULE_KIND_LABEL,
    DEVICE_RULE_NODE,
    FAULT_TAINT_KEY,
    MANAGED_BY_LABEL,
    MANAGER,
)
from gpu_efficiency.engine.model import DeviceRule, DeviceUse, DraDevice, Toleration

GROUP = "resource.k8s.io"
SLICE_VERSION = "v1"
CLAIM_VERSION = "v1"
RULE_VERSION = "v1beta2"
#: Selects our DeviceTaintRules.
OURS = f"{MANAGED_BY_LABEL}={MANAGER}"
MAX_NAME = 253


def _uuid(driver: str, attributes: Mapping[str, Any]) -> str | None:
    for key in ("uuid", f"{driver}/uuid"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str) and value["string"]:
            return str(value["string"])
    return None


def parse_slices(items: Iterable[Mapping[str, Any]]) -> tuple[DraDevice, ...]:
    """The GPUs node-local slices list, from the newest generation of each pool."""
    newest: dict[tuple[str, str], int] = {}
    slices = []
    for item in items:
        spec = item.get("spec") or {}
        driver, node = spec.get("driver"), spec.get("nodeName")
        pool = spec.get("pool") or {}
        if not driver or not node or not pool.get("name"):
            continue
        key = (str(driver), str(pool["name"]))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(generation, newest.get(key, generation))
        slices.append((key, generation, str(node), spec.get("devices") or []))
    out = []
    for (driver, pool), generation, node, devices in slices:
        if generation != newest[(driver, pool)]:
            continue
        for device in devices:
            uuid = _uuid(driver, device.get("attributes") or {})
            if uuid is not None and device.get("name"):
                out.append(DraDevice(driver, pool, str(device["name"]), node, uuid))
    return tuple(sorted(out, key=lambda d: (d.node, d.key)))


def parse_rules(items: Iterable[Mapping[str, Any]]) -> tuple[DeviceRule, ...]:
    """Our DeviceTaintRules that select one device by driver, pool and name; others are not ours."""
    out = []
    for item in items:
        meta = item.get("metadata") or {}
        labels = meta.get("labels") or {}
        node = (meta.get("annotations") or {}).get(DEVICE_RULE_NODE)
        spec = item.get("spec") or {}
        selector = spec.get("deviceSelector") or {}
        taint = spec.get("taint") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGER or not node or DEVICE_RULE_KIND_LABEL not in labels:
            continue
        if not all(selector.get(k) for k in ("driver", "pool", "device")):
            continue
        out.append(
            DeviceRule(
                name=str(meta.get("name", "")),
                node=str(node),
                kind=str(labels[DEVICE_RULE_KIND_LABEL]),
                driver=str(selector["driver"]),
                pool=str(selector["pool"]),
                device=str(selector["device"]),
                effect=str(taint.get("effect", "")),
            )
        )
    return tuple(out)


def rule_name(kind: str, device: DraDevice) -> str:
    """'gpuefficiency-xid-node-1-gpu-3-<hash>': readable, unique per driver, pool and device."""
    digest = hashlib.sha256("/".join(device.key).encode()).hexdigest()[:10]
    middle = re.sub(r"[^a-z0-9.-]+", "-", f"{device.node}-{device.device}".lower()).strip("-.")
    head = f"gpuefficiency-{kind}-"
    middle = middle[: MAX_NAME - len(head) - len(digest) - 1].rstrip("-.")
    return f"{head}{middle}-{digest}"


def rule_body(kind: str, effect: str, device: DraDevice) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{RULE_VERSION}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(kind, device),
            "labels": {MANAGED_BY_LABEL: MANAGER, DEVICE_RULE_KIND_LABEL: kind},
            "annotations": {DEVICE_RULE_NODE: device.node, DEVICE_RULE_GPU: device.uuid},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
            "taint": {"key": FAULT_TAINT_KEY, "value": kind, "effect": effect},
        },
    }


def fault_tolerations(items: Iterable[Mapping[str, Any]] | None) -> tuple[Toleration, ...]:
    """The tolerations that can match our fault taint (its key, or every key with Exists)."""
    out = []
    for t in items or ():
        if not isinstance(t, Mapping):
            continue
        key, operator = str(t.get("key") or ""), str(t.get("operator") or "Equal")
        if key == FAULT_TAINT_KEY or (not key and operator == "Exists"):
            out.append(Toleration(key, operator, str(t.get("value") or ""), str(t.get("effect") or "")))
    return tuple(out)


def parse_claims(items: Iterable[Mapping[str, Any]]) -> tuple[DeviceUse, ...]:
    """Each allocated device of each ResourceClaim, with the pods the claim is reserved for."""
    out = []
    for item in items:
        status = item.get("status") or {}
        pods = tuple(
            str(r["uid"])
            for r in status.get("reservedFor") or ()
            if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid")
        )
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        for result in results:
            if not isinstance(result, Mapping) or not all(
                result.get(k) for k in ("driver", "pool", "device")
            ):
                continue
            key = (str(result["driver"]), str(result["pool"]), str(result["device"]))
            out.append(DeviceUse(key, pods, fault_tolerations(result.get("tolerations"))))
    return tuple(out)
