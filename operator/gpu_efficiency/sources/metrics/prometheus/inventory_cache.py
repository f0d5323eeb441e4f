"""The exporter inventory kept between cycles: read again only when a GPU's exporter may have changed.

The inventory (``exporter_inventory.py``) selects about thirty series per GPU, every metric name of
every generation: at 2,400 GPUs it was the costliest query of a steady cycle (72,000 series, more
backend time than identity and both candidate filters together; ``bench/scale/RESULTS.md``). What it
answers (each GPU's generation, blind spots and XID counter) changes only when an exporter does. So
it is read:

- on the first fetch, and when the matchers change;
- in the same cycle, as soon as identity names a GPU that is new, or whose scrape targets (the
  ``instance`` labels: an exporter pod restarted by an upgrade gets a new address) are not those it
  had when the inventory was last read;
- at least every ``INVENTORY_REFRESH_S``, for an exporter upgraded in place behind the same address
  (``hostNetwork``). Until then the GPU keeps its old view, which errs towards keeping GPUs: a 4.9
  GPU read as 4.8 has its memory in bytes read as MiB (more memory held, never idle by it), a blind
  spot not yet seen is missing data (Unknown, never idle), an XID counter not yet seen leaves XIDs to
  the gauge, and one no longer served counts none (no taint on it) until the refresh. A signal no
  longer served is missing data whatever the view says.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus import exporter_inventory
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.exporter_inventory import ExporterView
from gpu_efficiency.sources.metrics.prometheus.promql import Query

Key = tuple[str, str]  # (UUID, GPU_I_ID), as the inventory's answer keys its views
#: The longest a GPU keeps the view read for it while its targets stay the same: an exporter
#: upgraded behind the same address is seen within 5 minutes, one read in ten cycles at 30 s.
INVENTORY_REFRESH_S = 300.0


def _targets(identity: Mapping[GPUKey, Identity]) -> dict[Key, frozenset[str]]:
    return {(k.uuid, k.instance_id): frozenset(i.claims) for k, i in identity.items()}


@dataclass
class InventoryCache:
    """The last inventory read, the scrape targets each GPU had then, and when it was read."""

    views: dict[Key, ExporterView] = field(default_factory=dict)
    targets: dict[Key, frozenset[str]] = field(default_factory=dict)
    at: float = -math.inf
    matchers: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def due(self, now: float, matchers: str) -> bool:
        """Must this cycle read the inventory whatever identity says (first read, new matchers, its
        age past ``INVENTORY_REFRESH_S``, or a clock that went back)?"""
        with self.lock:
            age = now - self.at
            return matchers != self.matchers or not 0 <= age < INVENTORY_REFRESH_S

    def changed(self, identity: Mapping[GPUKey, Identity]) -> bool:
        """Does identity name a GPU the last read did not, or one behind other scrape targets?"""
        with self.lock:
            known = self.targets
            return any(known.get(key) != targets for key, targets in _targets(identity).items())

    def store(
        self, views: Mapping[Key, ExporterView], identity: Mapping[GPUKey, Identity], at: float, matchers: str
    ) -> None:
        """Keep a read made at ``at``, with the targets identity named in the same cycle."""
        with self.lock:
            if at < self.at and matchers == self.matchers:  # an older cycle's read finishing late
                return
            self.views, self.targets = dict(views), _targets(identity)
            self.at, self.matchers = at, matchers

    def kept(self) -> dict[Key, ExporterView]:
        with self.lock:
            return self.views


@dataclass
class InventoryRound:
    """One fetch's use of the cache: the inventory sent in the first round when due, or after
    identity when it names a changed GPU; otherwise the kept views."""

    cache: InventoryCache
    at: float
    matchers: str
    sent: bool = False
    views: dict[Key, ExporterView] | None = None
    identity: Mapping[GPUKey, Identity] | None = None

    def first(self) -> list[Query]:
        """The first round's inventory query, if the cache says it is due."""
        self.sent = self.cache.due(self.at, self.matchers)
        return [exporter_inventory.query(self.matchers)] if self.sent else []

    def after_identity(self, identity: Mapping[GPUKey, Identity]) -> list[Query]:
        """Identity is in: the inventory query now if it names a GPU the kept read does not cover."""
        self.identity = identity
        if self.sent or not self.cache.changed(identity):
            return []
        self.sent = True
        return [exporter_inventory.query(self.matchers)]

    def result(self) -> dict[Key, ExporterView]:
        """This cycle's views: the fresh read (kept for later cycles) or the kept one."""
        if self.views is None:
            return self.cache.kept()
        if self.identity is not None:
            self.cache.store(self.views, self.identity, self.at, self.matchers)
        return self.views
