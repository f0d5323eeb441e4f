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
  (``hostNetwork``): in the background once a cycle has its samples (``FetchResult.then``), not in
  the cycle, since at 8,000 GPUs the read cost Prometheus 3-4 s of CPU and made every tenth steady
  cycle twice as long (``bench/scale/RESULTS.md``); the next cycles use it. A read still missing at
  twice that age (the background reads failed) is made in the cycle again, whose failure is the
  fetch's. Until then the GPU keeps its old view, which errs towards keeping GPUs: a 4.9
  GPU read as 4.8 has its memory in bytes read as MiB (more memory held, never idle by it), a blind
  spot not yet seen is missing data (Unknown, never idle), an XID counter not yet seen leaves XIDs to
  the gauge, and one no longer served counts none (no taint on it) until the refresh. A signal no
  longer served is missing data whatever the view says.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpu_efficiency.sources.metrics.labels import GPUKey
from gpu_efficiency.sources.metrics.prometheus import exporter_inventory
from gpu_efficiency.sources.metrics.prometheus.answers import Identity
from gpu_efficiency.sources.metrics.prometheus.exporter_inventory import ExporterView
from gpu_efficiency.sources.metrics.prometheus.promql import Query

log = logging.getLogger(__name__)

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
    #: The background read of an old inventory (``refresh``), while it runs.
    reading: threading.Thread | None = field(default=None, repr=False, compare=False)

    def due(self, now: float, matchers: str) -> bool:
        """Must this cycle read the inventory whatever identity says (first read, new matchers, a
        clock that went back, or an age past twice ``INVENTORY_REFRESH_S``: the background reads
        failed)? One merely older than ``INVENTORY_REFRESH_S`` is read after the cycle (``refresh``)."""
        with self.lock:
            age = now - self.at
            return matchers != self.matchers or not 0 <= age < 2 * INVENTORY_REFRESH_S

    def refresh(
        self,
        read: Callable[[], Mapping[Key, ExporterView]],
        identity: Mapping[GPUKey, Identity],
        at: float,
        matchers: str,
    ) -> bool:
        """Start reading an inventory older than ``INVENTORY_REFRESH_S`` in the background (``read``:
        the query at ``at``), to be kept with the targets ``identity`` named at ``at``. None is
        started while one runs; a failed read changes nothing (the next cycle's ``then`` tries
        again). Returns whether one was started."""
        with self.lock:
            if self.reading is not None and self.reading.is_alive():
                return False
            age = at - self.at
            if matchers != self.matchers or not age >= INVENTORY_REFRESH_S:  # NaN: no
                return False

            def run() -> None:
                try:
                    views = read()
                except Exception as exc:  # kept view: it errs towards keeping GPUs (module docstring)
                    log.warning("reading the exporter inventory in the background failed: %s", exc)
                    return
                self.store(views, identity, at, matchers)

            self.reading = threading.Thread(target=run, name="prometheus-inventory", daemon=True)
            self.reading.start()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background read (tests and benchmarks); False if it still runs after ``timeout``."""
        with self.lock:
            reading = self.reading
        if reading is not None:
            reading.join(timeout)
        return reading is None or not reading.is_alive()

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
