"""A scriptable NVML for tests, benchmarks and the e2e hook: values, per-probe errors, init failures, events.

Values live on ``FakeGpu`` in friendly units (W, MiB, percent); the methods convert them to NVML's units
so the collector's conversions are exercised exactly as with real NVML. A GPU's envelope (name, memory,
power, clocks, link) comes from the harness's one catalogue of GPU models (``gpu_models.MODELS``).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gpu_efficiency.agent.nvml.types import (
    DeviceInfo,
    EccCounter,
    EccMode,
    EventKind,
    GpmMetrics,
    Memory,
    NvmlCode,
    NvmlError,
    NvmlEvent,
    PcieLink,
    Probe,
    RemappedRows,
    Threshold,
    Utilization,
)
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL, GPUModel

MIB = 1024 * 1024
#: GPU families with GPM (NVML's GPU performance monitoring needs Hopper or newer).
GPM_FAMILIES = frozenset({"hopper", "blackwell"})
IDLE_GPM = GpmMetrics(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def fake_uuid(node: str, index: int) -> str:
    """Stable GPU UUID for a fake GPU, so scenarios and --fake-pods can name it across runs."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuefficiency.io/fake/{node}/{index}"))


@dataclass
class FakeGpu:
    """One simulated GPU (a MIG device when ``parent_uuid`` is set); change it via ``FakeBackend.update``."""

    index: int
    uuid: str
    name: str = DEFAULT_MODEL.model_name  # the defaults: an idle GPU of the catalogue's default model
    pci_bus_id: str = ""
    gpu_util: float = 0.0
    mem_util: float = 0.0
    fb_total_mib: float = float(DEFAULT_MODEL.fb_total_mib)
    fb_used_mib: float = 0.0
    power_w: float = DEFAULT_MODEL.idle_power_w
    power_limit_w: float = DEFAULT_MODEL.max_power_w
    temp_c: int = round(DEFAULT_MODEL.idle_temp_c)
    memory_temp_c: int = round(DEFAULT_MODEL.idle_temp_c) + 2  # HBM idles a little warmer than the die
    slowdown_c: int = 87  # an H100's thresholds (nvidia-smi -q)
    shutdown_c: int = 92
    clock_event_reasons: int = 0
    sm_clock_mhz: int = DEFAULT_MODEL.sm_clock_max_mhz
    pcie_gen: int = DEFAULT_MODEL.pcie_gen
    pcie_width: int = DEFAULT_MODEL.pcie_width
    pcie_max_gen: int = DEFAULT_MODEL.pcie_gen
    pcie_max_width: int = DEFAULT_MODEL.pcie_width
    ecc_enabled: bool = True
    ecc_pending: bool = True
    ecc_dbe_volatile: int = 0
    ecc_dbe_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pending: bool = False
    gpm: GpmMetrics | None = IDLE_GPM  # None: no GPM (pre-Hopper)
    pids: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # Probe or "events"/"pids" -> NVML code
    mig: list[FakeGpu] = field(default_factory=list)
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        if not self.pci_bus_id:
            self.pci_bus_id = f"00000000:{0x18 + self.index:02X}:00.0"

    def info(self) -> DeviceInfo:
        return DeviceInfo(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            pci_bus_id=self.pci_bus_id,
            parent_uuid=self.parent_uuid,
            gpu_instance_id=self.gpu_instance_id,
            compute_instance_id=0 if self.parent_uuid else None,
            mig_profile=self.mig_profile,
        )


def fake_gpu(model: GPUModel, index: int, uuid: str) -> FakeGpu:
    """An idle GPU of a catalogue model: its name, memory, idle power, power limit, clocks, link and GPM."""
    return FakeGpu(
        index=index,
        uuid=uuid,
        name=model.model_name,
        fb_total_mib=float(model.fb_total_mib),
        power_w=model.idle_power_w,
        power_limit_w=model.max_power_w,
        temp_c=round(model.idle_temp_c),
        memory_temp_c=round(model.idle_temp_c) + 2,
        sm_clock_mhz=model.sm_clock_max_mhz,
        pcie_gen=model.pcie_gen,
        pcie_width=model.pcie_width,
        pcie_max_gen=model.pcie_gen,
        pcie_max_width=model.pcie_width,
        gpm=IDLE_GPM if model.family in GPM_FAMILIES else None,
    )


@dataclass(frozen=True, slots=True)
class TimedStep:
    """A change applied once the backend has been initialised for ``at`` seconds."""

    at: float
    apply: Callable[[FakeBackend], None]


class FakeBackend:
    """In-memory NVML. Thread-safe: the sampler, the event thread and tests may use it at once."""

    name = "fake"

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        driver: str = "550.54.15",
        steps: Iterable[TimedStep] = (),
        clock: Callable[[], float] = time.monotonic,
        pollers: Iterable[Callable[[FakeBackend], None]] = (),
    ) -> None:
        """``pollers`` run whenever timed steps are checked (every 50 ms while the event thread
        waits): a way to script the fake from outside its process (``scenario.inbox_poller``)."""
        self.gpus = list(gpus)
        self.driver = driver
        self.initialised = False
        self.init_calls = 0
        self.calls = 0  # device queries answered, for tests and the benchmark
        self._failures: dict[str, list[int]] = {}  # "init"/"devices"/"wait_event" -> codes to raise next
        self._events: queue.Queue[NvmlEvent] = queue.Queue()
        self._registered: set[str] = set()
        self._gpm_primed: set[str] = set()
        self._steps = sorted(steps, key=lambda s: s.at)
        self._pollers = tuple(pollers)
        self._clock = clock
        self._started: float | None = None
        self._lock = threading.RLock()

    # ---- scripting ----------------------------------------------------------------------------------

    def gpu(self, key: str | int) -> FakeGpu:
        """A GPU by UUID or index (physical), or a MIG device by UUID."""
        for g in self._all():
            if g.uuid == key or (g.parent_uuid is None and str(g.index) == str(key)):
                return g
        raise KeyError(key)

    def update(self, key: str | int, **values: object) -> None:
        with self._lock:
            g = self.gpu(key)
            for name, value in values.items():
                if not hasattr(g, name):
                    raise AttributeError(f"FakeGpu has no field {name!r}")
                setattr(g, name, value)

    def fail(self, key: str | int, probe: Probe | str, code: int = NvmlCode.NOT_SUPPORTED) -> None:
        """Make one probe of one GPU raise ``code`` until ``recover``."""
        with self._lock:
            self.gpu(key).errors[str(probe)] = code

    def fail_next(self, op: str, code: int, times: int = 1) -> None:
        """Make the next ``times`` calls of a backend-wide op ("init", "devices", "wait_event") fail."""
        with self._lock:
            self._failures.setdefault(op, []).extend([code] * times)

    def inject(
        self, key: str | int, kind: EventKind, data: int = 0, gpu_instance_id: int | None = None
    ) -> None:
        """Deliver an NVML event; a DBE also bumps the ECC counters, as the driver does."""
        with self._lock:
            g = self.gpu(key)
            if kind is EventKind.DBE:
                g.ecc_dbe_volatile += 1
                g.ecc_dbe_aggregate += 1
            if g.uuid in self._registered:
                self._events.put(NvmlEvent(g.uuid, kind, data, gpu_instance_id))

    # ---- NvmlBackend --------------------------------------------------------------------------------

    def init(self) -> None:
        with self._lock:
            self.init_calls += 1
            self._raise_scripted("init")
            self.initialised = True
            self._gpm_primed.clear()
            if self._started is None:
                self._started = self._clock()

    def shutdown(self) -> None:
        with self._lock:
            self.initialised = False
            self._registered.clear()

    def driver_version(self) -> str:
        self._check()
        return self.driver

    def devices(self) -> list[DeviceInfo]:
        self._check()
        with self._lock:
            self._raise_scripted("devices")
            return [g.info() for g in self.gpus]

    def mig_devices(self, parent: DeviceInfo) -> list[DeviceInfo]:
        g = self._device(parent.uuid, "mig")
        return [m.info() for m in g.mig]

    def utilization(self, uuid: str) -> Utilization:
        g = self._device(uuid, Probe.UTILIZATION)
        return Utilization(gpu=g.gpu_util, memory=g.mem_util)

    def memory(self, uuid: str) -> Memory:
        g = self._device(uuid, Probe.MEMORY)
        total, used = int(g.fb_total_mib * MIB), int(g.fb_used_mib * MIB)
        return Memory(total_bytes=total, used_bytes=used, free_bytes=total - used)

    def power_usage_mw(self, uuid: str) -> int:
        return int(self._device(uuid, Probe.POWER).power_w * 1000)

    def power_limit_mw(self, uuid: str) -> int:
        return int(self._device(uuid, Probe.POWER_LIMIT).power_limit_w * 1000)

    def temperature_c(self, uuid: str) -> int:
        return self._device(uuid, Probe.TEMPERATURE).temp_c

    def memory_temperature_c(self, uuid: str) -> int:
        return self._device(uuid, Probe.MEMORY_TEMPERATURE).memory_temp_c

    def temperature_threshold_c(self, uuid: str, threshold: Threshold) -> int:
        if threshold is Threshold.SLOWDOWN:
            return self._device(uuid, Probe.SLOWDOWN_TEMPERATURE).slowdown_c
        return self._device(uuid, Probe.SHUTDOWN_TEMPERATURE).shutdown_c

    def clock_event_reasons(self, uuid: str) -> int:
        return self._device(uuid, Probe.CLOCK_EVENT_REASONS).clock_event_reasons

    def sm_clock_mhz(self, uuid: str) -> int:
        return self._device(uuid, Probe.SM_CLOCK).sm_clock_mhz

    def pcie_link(self, uuid: str) -> PcieLink:
        g = self._device(uuid, Probe.PCIE_LINK)
        return PcieLink(g.pcie_gen, g.pcie_width, g.pcie_max_gen, g.pcie_max_width)

    def ecc_mode(self, uuid: str) -> EccMode:
        g = self._device(uuid, Probe.ECC_MODE)
        return EccMode(current=g.ecc_enabled, pending=g.ecc_pending)

    def ecc_uncorrected(self, uuid: str, counter: EccCounter) -> int:
        if counter is EccCounter.VOLATILE:
            return self._device(uuid, Probe.ECC_DBE_VOLATILE).ecc_dbe_volatile
        return self._device(uuid, Probe.ECC_DBE_AGGREGATE).ecc_dbe_aggregate

    def remapped_rows(self, uuid: str) -> RemappedRows:
        g = self._device(uuid, Probe.REMAPPED_ROWS)
        return RemappedRows(
            g.remapped_correctable, g.remapped_uncorrectable, g.remap_pending, g.remap_failure
        )

    def retired_pages_pending(self, uuid: str) -> bool:
        return self._device(uuid, Probe.RETIRED_PAGES_PENDING).retired_pending

    def gpm_metrics(self, uuid: str) -> GpmMetrics | None:
        g = self._device(uuid, Probe.GPM)
        if g.gpm is None:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, "GPM needs Hopper or newer")
        with self._lock:
            if uuid not in self._gpm_primed:
                self._gpm_primed.add(uuid)
                return None
            return replace(g.gpm)

    def compute_pids(self, uuid: str) -> list[int]:
        return list(self._device(uuid, "pids").pids)

    def open_events(self, uuids: list[str]) -> dict[str, str]:
        self._check()
        failed: dict[str, str] = {}
        with self._lock:
            for u in uuids:
                code = self.gpu(u).errors.get("events")
                if code is not None:
                    failed[u] = NvmlError(code).code_name
                else:
                    self._registered.add(u)
        return failed

    def wait_event(self, timeout_s: float) -> NvmlEvent | None:
        self._check()
        with self._lock:
            self._raise_scripted("wait_event")
        deadline = time.monotonic() + timeout_s
        while True:  # with timed steps pending, wake every 50 ms so they fire on time
            self._tick()
            left = deadline - time.monotonic()
            try:
                slice_ = min(0.05, left) if self._steps or self._pollers else left
                return self._events.get(timeout=max(0.0, slice_))
            except queue.Empty:
                if left <= 0:
                    return None

    def close_events(self) -> None:
        with self._lock:
            self._registered.clear()

    # ---- internals ----------------------------------------------------------------------------------

    def _all(self) -> list[FakeGpu]:
        return [*self.gpus, *(m for g in self.gpus for m in g.mig)]

    def _check(self) -> None:
        if not self.initialised:
            raise NvmlError(NvmlCode.UNINITIALIZED)

    def _raise_scripted(self, op: str) -> None:
        codes = self._failures.get(op)
        if codes:
            raise NvmlError(codes.pop(0), f"scripted {op} failure")

    def _device(self, uuid: str, probe: str) -> FakeGpu:
        self._check()
        self._tick()
        with self._lock:
            self.calls += 1
            try:
                g = self.gpu(uuid)
            except KeyError:  # as NVML answers a handle lookup for a device that is gone (MIG reconfigured)
                raise NvmlError(NvmlCode.NOT_FOUND, f"no device {uuid}") from None
            code = g.errors.get(str(probe))
        if code is not None:
            raise NvmlError(code)
        return g

    def _tick(self) -> None:
        """Apply the timed steps that are due, and whatever the pollers bring."""
        for poll in self._pollers:
            if self._started is not None:
                poll(self)
        if not self._steps or self._started is None:
            return
        with self._lock:
            elapsed = self._clock() - self._started
            while self._steps and self._steps[0].at <= elapsed:
                self._steps.pop(0).apply(self)
