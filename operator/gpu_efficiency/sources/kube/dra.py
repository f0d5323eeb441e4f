"""DRA reads for single-GPU quarantine: the GPUs ResourceSlices publish, and our DeviceTaintRules.

``DraReader`` LISTs them (one-shot commands, and the watches' fallback); the long-running operator
reads them from watches (``sources/kube/dra_cache``), so that a steady cycle makes no request at all.
At most one LIST per cycle (none where no DRA GPU and no rule of ours exists) and two a minute,
whatever the cluster size (what counts as a GPU and as our rule:
``objects/dra``). When the API server does not serve ``resource.k8s.io/v1beta2``
DeviceTaintRules (Kubernetes 1.36 needs ``--runtime-config=resource.k8s.io/v1beta2=true`` and the
``DRADeviceTaintRules`` feature gate) or RBAC forbids the reads, no device is reported: faults keep
the node taint, which quarantines more, never less. For a policy whose device taints are NoExecute,
the ResourceClaims are listed too while a rule of ours exists (one more LIST a cycle, watched or
not: claims come and go with every pod), so the drain knows which pods hold the faulty device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from gpu_efficiency.engine.model import DeviceRule, DeviceUse, DraDevice
from gpu_efficiency.objects.dra import (
    CLAIM_VERSION,
    GROUP,
    OURS,
    RULE_VERSION,
    SLICE_VERSION,
    parse_claims,
    parse_rules,
    parse_slices,
)

log = logging.getLogger(__name__)


#: Seconds between two asks of an API the server does not serve, or RBAC forbids.
UNSERVED_RETRY_S = 60.0


def unserved(status: int | None) -> str | None:
    """Why no DRA read can be served (404: not served, 403: not allowed), or None for another error."""
    if status == 404:
        return "ResourceSlices or DeviceTaintRules not served: faults taint nodes"
    if status == 403:
        return "ResourceSlices or DeviceTaintRules not allowed (RBAC): faults taint nodes"
    return None


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


class DraSource(Protocol):
    """What a cycle reads DRA state from: ``DraReader`` or the watched ``WatchedDraReader``."""

    @property
    def requests(self) -> int:
        """API requests made for the cycles so far (the cycle counts the difference)."""
        ...

    def read(self) -> DraState: ...

    def rules_written(self) -> None:
        """A DeviceTaintRule of ours was created, changed or deleted: the next read must show it."""
        ...

    def with_claims(self, state: DraState) -> DraState:
        """``state`` with the devices ResourceClaims hold (a NoExecute drain needs them)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


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
    _written: bool = False  # a rule of ours was written since the last read: read the rules

    def start(self) -> None:
        """Nothing to start: every read LISTs."""

    def stop(self) -> None:
        """Nothing to stop."""

    def rules_written(self) -> None:
        self._written = True

    def remember(self, state: DraState) -> None:
        """A good state read elsewhere (the watches): what a failed LIST falls back on."""
        if not state.blind and not state.error:
            self._last = state

    def read(self) -> DraState:
        now = self.clock()
        due = self._slices_at is None or now - self._slices_at >= self.slices_ttl_s
        last = self._last
        quiet = last is not None and not last.devices and not last.rules and not last.blind
        if not due and quiet and not self._written and last is not None:
            return last  # no DRA GPU and no rule of ours (or not served): nothing to read yet
        written, self._written = self._written, False
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
            why = unserved(exc.status)
            if why is not None:  # not served or not allowed: no rule of ours can exist
                self._last, self._slices_at = DraState(error=why), now
                return self.say(self._last)
            error = f"DRA read failed (HTTP {exc.status}: {exc.reason})"
            if written:  # the last read predates our write: a rule it lacks is not an admin's removal
                self._written = True
                return self.say(DraState(error=error, blind=True))
            if last is not None and not last.blind:
                return self.say(DraState(last.devices, last.rules, error=error, uses=None))
            return self.say(DraState(error=error, blind=True))
        self._last = DraState(devices=devices, rules=parse_rules(rules.get("items") or []))
        return self.say(self._last)

    def with_claims(self, state: DraState) -> DraState:
        """``state`` with the devices ResourceClaims hold, for a policy whose device taints are
        NoExecute (the drain evicts only their pods): LISTed (and counted) only while a rule of ours
        exists; a failed LIST gives ``uses=None``, and the drain then waits for its timeout."""
        if not state.rules or state.blind:
            return state
        try:
            self.requests += 1
            claims = self.api.list_cluster_custom_object(GROUP, CLAIM_VERSION, "resourceclaims")
        except ApiException as exc:
            error = f"ResourceClaims not read (HTTP {exc.status}: {exc.reason})"
            return DraState(state.devices, state.rules, error=error, uses=None)
        return DraState(state.devices, state.rules, uses=parse_claims(claims.get("items") or []))

    def say(self, state: DraState) -> DraState:
        """Log the state's error once per change (the watched reader's states too), not every cycle."""
        if state.error and state.error != self._said:
            log.info("single-GPU quarantine: %s", state.error)
        self._said = state.error
        return state
