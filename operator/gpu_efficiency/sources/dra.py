"""DRA reads for single-GPU quarantine: the GPUs ResourceSlices publish, and our DeviceTaintRules.

Two LISTs per cycle, whatever the cluster size. A device counts as a GPU when the slice gives it
a ``uuid`` attribute (NVIDIA's DRA driver does; a driver-qualified ``<driver>/uuid`` too), which
is how the metrics name the GPU; only the newest generation of each pool is read (older slices
are being replaced). When the API server does not serve ``resource.k8s.io/v1beta2``
DeviceTaintRules (Kubernetes 1.36 needs ``--runtime-config=resource.k8s.io/v1beta2=true`` and the
``DRADeviceTaintRules`` feature gate) or RBAC forbids the reads, no device is reported: faults keep
the node taint, which quarantines more, never less.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api.names import DEVICE_RULE_KIND_LABEL, DEVICE_RULE_NODE, MANAGED_BY_LABEL, MANAGER
from gpu_efficiency.engine.model import DeviceRule, DraDevice

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
SLICE_VERSION = "v1"
RULE_VERSION = "v1beta2"
#: Selects our DeviceTaintRules.
OURS = f"{MANAGED_BY_LABEL}={MANAGER}"


class CustomApi(Protocol):
    """The CustomObjectsApi method used here (a fake implements it in unit tests)."""

    def list_cluster_custom_object(
        self, group: str, version: str, plural: str, *, label_selector: str | None = None
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class DraState:
    devices: tuple[DraDevice, ...] = ()
    rules: tuple[DeviceRule, ...] = ()
    error: str = ""  # why single-GPU quarantine is off or stale this cycle ('' when it is not)
    blind: bool = False  # unread, no earlier read to stand in: no fault may be decided this cycle


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


@dataclass
class DraReader:
    """Reads both each cycle. A failed read (other than "not served") gives the last good read, or
    with none yet, a state marked ``blind``: a missing rule would otherwise look like an admin's
    removal and end a quarantine."""

    api: CustomApi
    _last: DraState | None = None
    _said: str = ""  # the last error logged (once per change, not every cycle)

    def read(self) -> DraState:
        try:
            rules = self.api.list_cluster_custom_object(
                GROUP, RULE_VERSION, "devicetaintrules", label_selector=OURS
            )
            slices = self.api.list_cluster_custom_object(GROUP, SLICE_VERSION, "resourceslices")
        except ApiException as exc:
            if exc.status in (403, 404):  # not served or not allowed: no rule of ours can exist
                what = "not served" if exc.status == 404 else "not allowed (RBAC)"
                self._last = DraState(error=f"ResourceSlices or DeviceTaintRules {what}: faults taint nodes")
                return self._say(self._last)
            error = f"DRA read failed (HTTP {exc.status}: {exc.reason})"
            if self._last is not None:
                return self._say(DraState(self._last.devices, self._last.rules, error=error))
            return self._say(DraState(error=error, blind=True))
        self._last = DraState(
            devices=parse_slices(slices.get("items") or []), rules=parse_rules(rules.get("items") or [])
        )
        return self._say(self._last)

    def _say(self, state: DraState) -> DraState:
        if state.error and state.error != self._said:
            log.info("single-GPU quarantine: %s", state.error)
        self._said = state.error
        return state
