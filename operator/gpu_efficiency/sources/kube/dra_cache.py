"""DRA state as the long-running operator reads it: ResourceSlices and our DeviceTaintRules, watched.

Why: ``DraReader`` LISTs our rules every cycle where DRA GPUs exist and the slices every minute
(two requests every other cycle at 1,000 nodes even without one DRA GPU), and sees a new slice
only up to a minute late. Two informers (``sources/kube/watch``: list, then watch) keep the small parsed
forms instead (a slice's GPUs, one rule each), so a steady cycle makes no request and a new slice,
or an admin's removal of our rule, is seen within seconds.

Safety is ``DraReader``'s:
- a kind the server does not serve (404: ``resource.k8s.io/v1beta2`` not turned on) or RBAC forbids
  (403) gives no device, so faults taint nodes; its informer asks again once a minute, not in a loop;
- an informer not synced yet, or whose watch cannot be vouched for (``max_broken``), is not read:
  the cycle LISTs through ``DraReader`` instead (counted), which falls back on the last good state,
  else on ``blind`` (no fault decided): a missing rule never reads as an admin's removal;
- read-your-writes: after a write of our rules (``rules_written``) the next read LISTs our rules
  (a quorum read, so it shows the write), and so does every read until the rules' watch shows
  what that LIST showed, or has delivered its resourceVersion: a cycle never takes a late watch
  event for an admin's act.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import metrics
from gpu_efficiency.engine.model import DeviceRule, DraDevice
from gpu_efficiency.objects.dra import (
    GROUP,
    OURS,
    RULE_VERSION,
    SLICE_VERSION,
    parse_rules,
    parse_slices,
)
from gpu_efficiency.sources.kube.dra import UNSERVED_RETRY_S, DraReader, DraState, unserved
from gpu_efficiency.sources.kube.watch import Informer, InformerSet

log = logging.getLogger(__name__)

#: Objects per LIST page: a ResourceSlice of 8 GPUs with their attributes is ~10 KiB of JSON.
PAGE_SIZE = 100


@dataclass(frozen=True, slots=True)
class SliceGpus:
    """What the cache keeps of one node-local ResourceSlice: its pool's generation and its GPUs."""

    driver: str
    pool: str
    generation: int
    devices: tuple[DraDevice, ...]


def slice_gpus(obj: Mapping[str, Any]) -> SliceGpus:
    """The slice's GPUs (``driver`` '' for a slice that is not node-local: not kept)."""
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    if not spec.get("driver") or not spec.get("nodeName") or not pool.get("name"):
        return SliceGpus("", "", 0, ())
    generation = int(pool.get("generation") or 0)
    return SliceGpus(str(spec["driver"]), str(pool["name"]), generation, parse_slices([obj]))


def newest_gpus(slices: tuple[SliceGpus, ...]) -> tuple[DraDevice, ...]:
    """The GPUs of the newest generation of each pool (``parse_slices`` over the whole list)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(s.generation, newest.get(key, s.generation))
    out = [d for s in slices if s.generation == newest[(s.driver, s.pool)] for d in s.devices]
    return tuple(sorted(out, key=lambda d: (d.node, d.key)))


def parse_rules_of_one(obj: Mapping[str, Any]) -> tuple[DeviceRule, ...]:
    """The rule if it is ours (one device), else nothing (not kept)."""
    return parse_rules([obj])


def _rule_name(rules: tuple[DeviceRule, ...]) -> str:
    return rules[0].name


def _not_served_retry(exc: Exception) -> float | None:
    status = exc.status if isinstance(exc, ApiException) else None
    return UNSERVED_RETRY_S if unserved(status) is not None else None


class DraCache(InformerSet):
    """The two informers: every ResourceSlice (cluster-wide), and our DeviceTaintRules (by label).

    ``list_slices`` and ``list_rules``: the generated LIST methods with their arguments bound
    (``for_client``), which also watch (``watch=True``)."""

    def __init__(
        self, list_slices: Callable[..., Any], list_rules: Callable[..., Any], **options: Any
    ) -> None:
        options.setdefault("page_size", PAGE_SIZE)
        options.setdefault("retry_after", _not_served_retry)
        self.slices: Informer[SliceGpus] = Informer(
            "resourceslices", list_slices, slice_gpus, keep=lambda v: bool(v.driver), **options
        )
        self.rules: Informer[tuple[DeviceRule, ...]] = Informer(
            "devicetaintrules", list_rules, parse_rules_of_one, keep=bool, order=_rule_name, **options
        )

    @classmethod
    def for_client(cls, api_client: client.ApiClient, **options: Any) -> DraCache:
        custom = client.CustomObjectsApi(api_client)
        return cls(
            partial(custom.list_cluster_custom_object, GROUP, SLICE_VERSION, "resourceslices"),
            partial(
                custom.list_cluster_custom_object,
                GROUP,
                RULE_VERSION,
                "devicetaintrules",
                label_selector=OURS,
            ),
            **options,
        )

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (self.slices, self.rules)


class WatchedDraReader:
    """``DraReader``'s interface (``sources/kube/dra.DraSource``) over a ``DraCache``, LISTing (through
    ``fallback``) what the cache cannot serve, and our rules after our own writes."""

    def __init__(self, cache: DraCache, fallback: DraReader) -> None:
        self.cache = cache
        self.fallback = fallback
        self._requests = 0  # our own rule LISTs after writes (the fallback counts its own)
        self._written = False  # a rule of ours was written: the next read LISTs our rules
        self._listed_at: int | None = None  # the last such LIST's resourceVersion, until watched past
        self._slices: tuple[SliceGpus, ...] | None = None  # the snapshot ``_devices`` was built from
        self._devices: tuple[DraDevice, ...] = ()
        self._lock = threading.Lock()

    @property
    def requests(self) -> int:
        return self._requests + self.fallback.requests

    def start(self) -> None:
        self.cache.start()

    def stop(self) -> None:
        self.cache.stop()

    def rules_written(self) -> None:
        with self._lock:
            self._written = True
        self.fallback.rules_written()

    def read(self) -> DraState:
        with self._lock:
            slices, rules = self.cache.slices.snapshot(), self.cache.rules.snapshot()
            if slices is None or rules is None:
                why = self._unserved()
                if why is not None:  # its informer asks again once a minute: no request here
                    return self.fallback.say(DraState(error=why))
                return self._listed()  # not synced yet, or broken too long: LIST, counted
            if slices is not self._slices:
                self._slices, self._devices = slices, newest_gpus(slices)
            watched = tuple(r for views in rules for r in views)
            try:
                listed = self._after_write(watched)
            except ApiException as exc:  # the watch may lack our write: a missing rule is not an admin's
                error = f"DRA read failed (HTTP {exc.status}: {exc.reason}) listing our rules after a write"
                return self.fallback.say(DraState(error=error, blind=True))
            ours = listed if listed is not None else watched
            state = DraState(devices=self._devices, rules=ours)
            self.fallback.remember(state)
            return self.fallback.say(state)

    def with_claims(self, state: DraState) -> DraState:
        return self.fallback.with_claims(state)  # claims change with every pod: LISTed, not watched

    def _listed(self) -> DraState:
        """``DraReader``'s LISTs (its last good state, else blind, when they fail)."""
        before = self.fallback.requests
        state = self.fallback.read()
        if self.fallback.requests > before:
            for informer in self.cache.informers:
                if not informer.usable():
                    metrics.CACHE_FALLBACKS.labels(informer.resource).inc()
            log.info(
                "DRA: cache not synced or its watch broken: listed instead (%d requests)",
                self.fallback.requests - before,
            )
        return state

    def _unserved(self) -> str | None:
        """Why an informer that cannot be read will not be until the server changes (404, 403)."""
        for informer in self.cache.informers:
            error = informer.error
            if not informer.usable() and isinstance(error, ApiException):
                why = unserved(error.status)
                if why is not None:
                    return why
        return None

    def _after_write(self, watched: tuple[DeviceRule, ...]) -> tuple[DeviceRule, ...] | None:
        """Our rules as a LIST shows them, while the watch may not show our last write yet: None
        once the watch showed what the LIST did, or has delivered the LIST's resourceVersion (a
        bookmark). A failed LIST raises, and is tried again."""
        if not self._written:
            if self._listed_at is None:
                return None
            version = _int(self.cache.rules.resource_version)
            if version is not None and version >= self._listed_at:
                self._listed_at = None
                return None
        self._written = False
        self._requests += 1
        try:
            listed = self.fallback.api.list_cluster_custom_object(
                GROUP, RULE_VERSION, "devicetaintrules", label_selector=OURS
            )
        except ApiException:
            self._written = True
            raise
        rules = parse_rules(listed.get("items") or [])
        caught_up = set(rules) == set(watched)  # the watch has delivered our write (and no other since)
        self._listed_at = (
            None if caught_up else _int((listed.get("metadata") or {}).get("resourceVersion")) or 0
        )
        return rules


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None
