"""The agent process: NVML init with backoff, the sampling loop, fault events and pod attribution.

Threads: ``sampler`` (init, device scan, one sample per interval), ``nvml-events`` (see faults.py) and
``attribution`` (pod-resources every few seconds, so a slow kubelet never delays a sample). Outputs read
state under one lock and never call NVML, so ``/metrics`` costs no NVML calls however often it is scraped.

An NVML failure never stops the process: ``/healthz`` stays 200, ``/readyz`` turns 503 with the reason,
and init is retried with exponential backoff.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_efficiency.agent import snapshot
from gpu_efficiency.agent.collect import Collector, GpuReading
from gpu_efficiency.agent.exposition import AgentMetrics, HostLabels
from gpu_efficiency.agent.faults import EventWatcher, FaultEvent, FaultLog
from gpu_efficiency.agent.fields import HISTORY_SIGNALS
from gpu_efficiency.agent.history import History
from gpu_efficiency.agent.naming import DEFAULT_NAMES, naming
from gpu_efficiency.agent.nvml.types import DeviceInfo, NvmlBackend, NvmlError
from gpu_efficiency.agent.pods import Attribution, AttributionResult, Attributor, pods_for
from gpu_efficiency.agent.state import GpuView
from gpu_efficiency.api.exporter_fields import Generation

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_name: str
    hostname: str = ""  # the hostname (Hostname) label; defaults to node_name
    exporter_names: Generation = DEFAULT_NAMES  # whose names, units and node label /metrics serves
    interval_s: float = 1.0
    history_s: float = 900.0  # rolling history kept per GPU
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    attribution_interval_s: float = 10.0
    rescan_interval_s: float = 60.0  # device and MIG layout re-read
    event_poll_s: float = 0.5
    max_events: int = 256
    ready_intervals: float = 3.0  # /readyz fails when the latest sample is older than this many intervals


class Agent:
    def __init__(
        self,
        backend: NvmlBackend,
        config: AgentConfig,
        attributor: Attributor | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.config = config
        self.faults = FaultLog(config.max_events, clock)
        self.metrics = AgentMetrics(self.views, self._host_labels, naming(config.exporter_names))
        self._clock = clock
        self._collector = Collector(backend, clock)
        self._attributor = attributor if attributor is not None else Attributor(backend)
        self._watcher = EventWatcher(backend, self.faults, self._on_fault, config.event_poll_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # sample now (after a fault event)
        self._attr_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fault_listeners: list[Callable[[FaultEvent], None]] = []
        # state guarded by _lock
        self._nvml_ok = False
        self._init_error = "NVML not initialised yet"
        self._init_failures = 0
        self._next_init = 0.0  # monotonic
        self._driver = ""
        self._devices: list[DeviceInfo] = []
        self._next_rescan = 0.0
        self._readings: dict[str, GpuReading] = {}
        self._histories: dict[str, History] = {}
        self._attribution = AttributionResult({}, "none", "not resolved yet")
        self._last_sample: float | None = None  # monotonic

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        for name, target in (("sampler", self._sample_loop), ("attribution", self._attribution_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._attr_wake.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        self._release_nvml()

    def add_fault_listener(self, listener: Callable[[FaultEvent], None]) -> None:
        self._fault_listeners.append(listener)

    # ---- reads (any thread) -------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            if not self._nvml_ok:
                wait = max(0.0, self._next_init - time.monotonic())
                return (
                    False,
                    f"{self._init_error} (failures: {self._init_failures}; next retry in {wait:.0f}s)",
                )
            if self._last_sample is None:
                return False, "NVML initialised; no sample yet"
            age = time.monotonic() - self._last_sample
        limit = self.config.ready_intervals * self.config.interval_s
        if age > limit:
            return False, f"latest sample {age:.1f}s old (limit {limit:.1f}s)"
        return True, f"ok: {len(self._devices)} devices, sampled {age:.1f}s ago"

    def views(self) -> list[GpuView]:
        with self._lock:
            readings = list(self._readings.values())
            attribution = self._attribution.pods
        return [self._view(r, attribution) for r in readings]

    def snapshot(self, query: Mapping[str, str]) -> dict[str, Any]:
        """The /snapshot document; ``query`` as in ``SnapshotRequest.parse`` (raises ValueError)."""
        now = self._clock()
        request = snapshot.SnapshotRequest.parse(query, now)
        ready, reason = self.readiness()
        views = self.views()
        with self._lock:
            histories = dict(self._histories)
            attribution = self._attribution
            driver = self._driver
        header = {
            "node": self.config.node_name,
            "hostname": self._host_labels().hostname,
            "interval_seconds": self.config.interval_s,
            "history_seconds": self.config.history_s,
            "ready": ready,
            "reason": reason,
            "backend": self.backend.name,
            "driver_version": driver,
            "attribution": {"source": attribution.source, "error": attribution.error},
        }
        return snapshot.build(
            header=header,
            views=views,
            histories=histories,
            events=self.faults.recent(),
            events_errors=self._watcher.unsupported,
            request=request,
            now=now,
        )

    # ---- sampling -----------------------------------------------------------------------------------

    def sample_once(self) -> None:
        """One round over all devices; raises NvmlError only when the device list cannot be read."""
        started = time.perf_counter()
        if time.monotonic() >= self._next_rescan:
            self._rescan()
        with self._lock:
            devices = list(self._devices)
        readings = [self._collector.read(d) for d in devices]
        with self._lock:
            attribution = self._attribution.pods
            for r in readings:
                uuid = r.device.uuid
                self._readings[uuid] = r
                self._histories[uuid].append(r.timestamp, self._view(r, attribution).metric_values())
            self._last_sample = time.monotonic()
        self.metrics.samples.inc()
        self.metrics.sample_seconds.observe(time.perf_counter() - started)
        self.metrics.last_sample.set(self._clock())

    def _sample_loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            if not self._nvml_ok and not self.try_init():
                self._stop.wait(max(0.0, self._next_init - time.monotonic()))
                continue
            try:
                self.sample_once()
            except NvmlError as exc:
                log.error("NVML device list failed (%s); re-initialising", exc)
                self._release_nvml(error=f"NVML lost: {exc}")
                continue
            except Exception:  # a bug must not end sampling for good; /readyz shows the stale samples
                log.exception("sampling failed")
            due = max(due + self.config.interval_s, time.monotonic())
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()

    def try_init(self) -> bool:
        """One NVML init attempt (the sampler retries with backoff); False and the reason in readiness()."""
        try:
            self.backend.init()
            driver = self.backend.driver_version()
            with self._lock:
                self._driver = driver
            self._rescan()
        except NvmlError as exc:
            self._init_failed(exc)
            return False
        with self._lock:
            self._nvml_ok = True
            self._init_failures = 0
            self._init_error = ""
            physical = [d.uuid for d in self._devices if not d.is_mig]
        self.metrics.nvml_ready.set(1)
        self._watcher.start(physical)
        self._attr_wake.set()
        log.info("NVML ready: driver %s, %d devices", driver, len(self._devices))
        return True

    def _init_failed(self, exc: NvmlError) -> None:
        with contextlib.suppress(NvmlError):
            self.backend.shutdown()
        with self._lock:
            self._init_failures += 1
            backoff = min(
                self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (self._init_failures - 1)
            )
            self._next_init = time.monotonic() + backoff
            self._init_error = f"NVML init failed: {exc}"
            failures = self._init_failures
        self.metrics.nvml_init_failures.inc()
        log.warning("NVML init failed (%s), attempt %d; retrying in %.0fs", exc, failures, backoff)

    def _release_nvml(self, error: str = "agent stopped") -> None:
        self._watcher.stop()
        with contextlib.suppress(NvmlError):
            self.backend.shutdown()
        with self._lock:
            self._nvml_ok = False
            self._init_error = error
            self._next_init = time.monotonic() + self.config.backoff_initial_s
            self._last_sample = None
            self._next_rescan = 0.0
        self.metrics.nvml_ready.set(0)

    def _rescan(self) -> None:
        devices: list[DeviceInfo] = []
        for gpu in self.backend.devices():
            devices.append(gpu)
            with contextlib.suppress(NvmlError):  # NOT_SUPPORTED: no MIG on this GPU
                devices.extend(self.backend.mig_devices(gpu))
        capacity = max(1, math.ceil(self.config.history_s / self.config.interval_s))
        with self._lock:
            known = {d.uuid for d in devices}
            for uuid in [u for u in self._histories if u not in known]:
                del self._histories[uuid]
                self._readings.pop(uuid, None)
            for d in devices:
                if d.uuid not in self._histories:
                    self._histories[d.uuid] = History(HISTORY_SIGNALS, capacity)
            self._devices = devices
            self._next_rescan = time.monotonic() + self.config.rescan_interval_s
        self.metrics.gpus.set(len(devices))

    # ---- attribution and faults ---------------------------------------------------------------------

    def _attribution_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                devices = list(self._devices)
                ok = self._nvml_ok
            if ok:
                try:
                    result = self._attributor.resolve(devices)
                except Exception:  # a bug or a device gone mid-pass must not end attribution for good
                    log.exception("pod attribution failed; keeping the last result until the next pass")
                    self.metrics.attribution_errors.inc()
                else:
                    if result.error:
                        self.metrics.attribution_errors.inc()
                    with self._lock:
                        self._attribution = result
            self._attr_wake.wait(self.config.attribution_interval_s)
            self._attr_wake.clear()

    def _on_fault(self, event: FaultEvent) -> None:
        self.metrics.events.labels(event.kind.value).inc()
        self._wake.set()  # re-read the ECC counters now
        for listener in self._fault_listeners:
            listener(event)

    # ---- helpers ------------------------------------------------------------------------------------

    def _view(self, reading: GpuReading, attribution: Attribution) -> GpuView:
        d = reading.device
        return GpuView(reading, self.faults.get(d.parent_uuid or d.uuid), pods_for(attribution, d))

    def _host_labels(self) -> HostLabels:
        return HostLabels(self.config.hostname or self.config.node_name, self._driver)
