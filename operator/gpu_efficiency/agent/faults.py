"""XID and double-bit ECC events from an NVML event set, read in their own thread.

Polling cannot see XIDs at all and sees ECC counters only at the next sample; the event thread records
each event the moment NVML delivers it (``wait_event`` wakes at least every ``poll_s``), so ``/metrics``,
``/snapshot`` and the node condition show it within about a second.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpu_efficiency.agent.nvml.types import EventKind, NvmlBackend, NvmlError, NvmlEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuFaults:
    """What the events said about one GPU since the agent started."""

    last_xid: int = 0  # dcgm-exporter's XID gauge: the last XID, 0 when none
    last_xid_time: float | None = None
    xid_events: int = 0
    xid_codes: tuple[int, ...] = ()  # distinct XIDs seen, in order (a later benign XID hides none)
    dbe_events: int = 0
    last_dbe_time: float | None = None


@dataclass(frozen=True, slots=True)
class FaultEvent:
    time: float  # unix seconds, when the agent received it
    uuid: str
    kind: EventKind
    data: int  # XID code for XID events
    gpu_instance_id: int | None = None


class FaultLog:
    """Latest fault state per GPU plus a bounded list of recent events."""

    def __init__(self, max_events: int = 256, clock: Callable[[], float] = time.time) -> None:
        self._by_gpu: dict[str, GpuFaults] = {}
        self._recent: deque[FaultEvent] = deque(maxlen=max_events)
        self._clock = clock
        self._lock = threading.Lock()

    def record(self, event: NvmlEvent) -> FaultEvent:
        now = self._clock()
        with self._lock:
            old = self._by_gpu.get(event.uuid, GpuFaults())
            if event.kind is EventKind.XID:
                codes = old.xid_codes if event.data in old.xid_codes else (*old.xid_codes, event.data)
                new = replace(
                    old,
                    last_xid=event.data,
                    last_xid_time=now,
                    xid_events=old.xid_events + 1,
                    xid_codes=codes,
                )
            else:
                new = replace(old, dbe_events=old.dbe_events + 1, last_dbe_time=now)
            self._by_gpu[event.uuid] = new
            fault = FaultEvent(now, event.uuid, event.kind, event.data, event.gpu_instance_id)
            self._recent.append(fault)
        return fault

    def get(self, uuid: str) -> GpuFaults:
        with self._lock:
            return self._by_gpu.get(uuid, GpuFaults())

    def all(self) -> dict[str, GpuFaults]:
        with self._lock:
            return dict(self._by_gpu)

    def recent(self) -> list[FaultEvent]:
        with self._lock:
            return list(self._recent)


class EventWatcher:
    """Owns the NVML event set for one NVML session; ``on_event`` runs in the watcher thread."""

    def __init__(
        self,
        backend: NvmlBackend,
        faults: FaultLog,
        on_event: Callable[[FaultEvent], None] = lambda _e: None,
        poll_s: float = 0.5,
    ) -> None:
        self._backend = backend
        self._faults = faults
        self._on_event = on_event
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unsupported: dict[str, str] = {}  # UUID -> why events are not delivered for it

    def start(self, uuids: Iterable[str]) -> None:
        try:
            self.unsupported = self._backend.open_events(list(uuids))
        except NvmlError as exc:
            log.warning("NVML events unavailable (%s): XID and ECC faults only seen by polling", exc)
            self.unsupported = dict.fromkeys(uuids, exc.code_name)
            return
        for uuid, why in self.unsupported.items():
            log.warning("GPU %s: no XID/ECC events (%s)", uuid, why)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._poll_s * 4 + 1)
            self._thread = None
        with contextlib.suppress(NvmlError):
            self._backend.close_events()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._backend.wait_event(self._poll_s)
            except NvmlError as exc:
                log.warning("NVML event wait failed: %s; retrying", exc)
                self._stop.wait(1.0)
                continue
            if event is None:
                continue
            fault = self._faults.record(event)
            log.warning("GPU %s: %s event, data %d", event.uuid, event.kind.value, event.data)
            try:
                self._on_event(fault)
            except Exception:  # a listener bug must not stop fault detection
                log.exception("fault listener failed")
