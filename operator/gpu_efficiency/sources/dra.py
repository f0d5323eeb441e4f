"""DRA reads for single-GPU quarantine: the GPUs ResourceSlices publish, and our DeviceTaintRules.

At most one LIST per cycle (none where no DRA GPU and no rule of ours exists) and two a minute,
whatever the cluster size (what counts as a GPU and as our rule:
``engine/faults/device_objects``). When the API server does not serve ``resource.k8s.io/v1beta2``
DeviceTaintRules (Kubernetes 1.36 needs ``--runtime-config=resource.k8s.io/v1beta2=true`` and the
``DRADeviceTaintRules`` feature gate) or RBAC forbids the reads, no device is reported: faults keep
the node taint, which quarantines more, never less. While a rule of ours exists, the ResourceClaims
are listed too (one more LIST a cycle), so a drain before a NoExecute device taint knows which pods
hold the faulty device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from gpu_efficiency.engine.faults.device_objects import (
    CLAIM_VERSION,
    GROUP,
    OURS,
    RULE_VERSION,
    SLICE_VERSION,
    parse_claims,
    parse_rules,
    parse_slices,
)
from gpu_efficiency.engine.model import DeviceRule, DeviceUse, DraDevice

log = logging.getLogger(__name__)


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
    #: Devices ResourceClaims hold, read only while a rule of ours exists (a drain may need them);
    #: None when that read failed.
    uses: tuple[DeviceUse, ...] | None = ()


@dataclass
class DraReader:
    """The slices are read at most every ``slices_ttl_s`` (drivers publish them when they start, so a
    new one is seen within a minute, and a GPU not yet seen keeps the node taint meanwhile), with our
    rules. Between those reads, our rules (a label-selected LIST) are read every cycle only while
    DRA GPUs or rules of ours exist: a cluster without them costs no request in a steady cycle. A
    failed read (other than "not served") gives the last good read, or with none yet, a state
    marked ``blind``: a missing rule would otherwise look like an admin's removal and end a
    quarantine. "Not served" or "not allowed" is asked again when the slices are due."""

    api: CustomApi
    slices_ttl_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    requests: int = 0  # LISTs made, for the cycle's API-read count
    _last: DraState | None = None
    _slices_at: float | None = None  # when the slices in _last were listed
    _said: str = ""  # the last error logged (once per change, not every cycle)

    def read(self) -> DraState:
        now = self.clock()
        due = self._slices_at is None or now - self._slices_at >= self.slices_ttl_s
        last = self._last
        if not due and last is not None and not last.devices and not last.rules and not last.blind:
            return last  # no DRA GPU and no rule of ours (or not served): nothing to read yet
        try:
            self.requests += 1
            rules = self.api.list_cluster_custom_object(
                GROUP, RULE_VERSION, "devicetaintrules", label_selector=OURS
            )
            devices = last.devices if last is not None else ()
            if due:
                self.requests += 1
                slices = self.api.list_cluster_custom_object(GROUP, SLICE_VERSION, "resourceslices")
                devices, self._slices_at = parse_slices(slices.get("items") or []), now
        except ApiException as exc:
            if exc.status in (403, 404):  # not served or not allowed: no rule of ours can exist
                what = "not served" if exc.status == 404 else "not allowed (RBAC)"
                self._last, self._slices_at = (
                    DraState(error=f"ResourceSlices or DeviceTaintRules {what}: faults taint nodes"),
                    now,
                )
                return self._say(self._last)
            error = f"DRA read failed (HTTP {exc.status}: {exc.reason})"
            if last is not None and not last.blind:
                return self._say(DraState(last.devices, last.rules, error=error))
            return self._say(DraState(error=error, blind=True))
        ours = parse_rules(rules.get("items") or [])
        self._last = DraState(devices=devices, rules=ours)
        if not ours:
            return self._say(self._last)
        try:
            self.requests += 1
            claims = self.api.list_cluster_custom_object(GROUP, CLAIM_VERSION, "resourceclaims")
        except ApiException as exc:  # a drain then waits for its timeout: who holds a device is unknown
            return self._say(
                DraState(
                    devices,
                    ours,
                    error=f"ResourceClaims not read (HTTP {exc.status}: {exc.reason})",
                    uses=None,
                )
            )
        return self._say(DraState(devices, ours, uses=parse_claims(claims.get("items") or [])))

    def _say(self, state: DraState) -> DraState:
        if state.error and state.error != self._said:
            log.info("single-GPU quarantine: %s", state.error)
        self._said = state.error
        return state
