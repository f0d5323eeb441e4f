"""NVML through nvidia-ml-py (``pynvml``), imported on ``init`` so the agent starts where it is missing.

Each method is one or two NVML calls; ``pynvml.NVMLError`` becomes ``NvmlError`` with the same code.
GPM needs two samples an interval apart: each device keeps two sample buffers and swaps them, so a call
returns the metrics since the previous call without sleeping.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

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
    RemappedRows,
    Threshold,
    Utilization,
)

T = TypeVar("T")
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event that is not about a MIG instance


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    handle: Any
    info: DeviceInfo
    parent_handle: Any = None  # MIG: GPM samples are taken through the parent
    gpm_supported: bool | None = None
    gpm_samples: tuple[Any, Any] | None = None  # (previous, spare)
    gpm_primed: bool = False


class PynvmlBackend:
    """The real NVML. One instance per process; NVML itself is thread-safe."""

    name = "nvml"

    def __init__(self) -> None:
        self._nvml: Any = None
        self._devices: dict[str, _Device] = {}
        self._event_set: Any = None
        self._lock = threading.Lock()

    # ---- lifecycle ----------------------------------------------------------------------------------

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py not installed
            raise NvmlError(NvmlCode.LIBRARY_NOT_FOUND, f"nvidia-ml-py missing: {exc}") from exc
        self._nvml = pynvml
        self._call(pynvml.nvmlInit)

    def shutdown(self) -> None:
        if self._nvml is None:
            return
        self.close_events()
        with self._lock:
            for dev in self._devices.values():
                for sample in dev.gpm_samples or ():
                    self._quiet(self._nvml.nvmlGpmSampleFree, sample)
            self._devices.clear()
        self._quiet(self._nvml.nvmlShutdown)

    def driver_version(self) -> str:
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def devices(self) -> list[DeviceInfo]:
        n = self._nvml
        found: list[DeviceInfo] = []
        for index in range(int(self._call(n.nvmlDeviceGetCount))):
            handle = self._call(n.nvmlDeviceGetHandleByIndex, index)
            info = DeviceInfo(
                index=index,
                uuid=_text(self._call(n.nvmlDeviceGetUUID, handle)),
                name=_text(self._call(n.nvmlDeviceGetName, handle)),
                pci_bus_id=_text(self._call(n.nvmlDeviceGetPciInfo, handle).busId),
            )
            self._remember(_Device(handle, info))
            found.append(info)
        return found

    def mig_devices(self, parent: DeviceInfo) -> list[DeviceInfo]:
        n = self._nvml
        parent_handle = self._handle(parent.uuid)
        current, _pending = self._call(n.nvmlDeviceGetMigMode, parent_handle)
        if current != n.NVML_DEVICE_MIG_ENABLE:
            return []
        found: list[DeviceInfo] = []
        for slot in range(int(self._call(n.nvmlDeviceGetMaxMigDeviceCount, parent_handle))):
            try:
                handle = self._call(n.nvmlDeviceGetMigDeviceHandleByIndex, parent_handle, slot)
            except NvmlError as exc:
                if exc.code == NvmlCode.NOT_FOUND:  # empty slot
                    continue
                raise
            name = _text(self._call(n.nvmlDeviceGetName, handle))
            info = DeviceInfo(
                index=parent.index,
                uuid=_text(self._call(n.nvmlDeviceGetUUID, handle)),
                name=name,
                pci_bus_id=parent.pci_bus_id,
                parent_uuid=parent.uuid,
                gpu_instance_id=int(self._call(n.nvmlDeviceGetGpuInstanceId, handle)),
                compute_instance_id=int(self._call(n.nvmlDeviceGetComputeInstanceId, handle)),
                mig_profile=name.rsplit("MIG ", 1)[1] if "MIG " in name else None,
            )
            self._remember(_Device(handle, info, parent_handle=parent_handle))
            found.append(info)
        return found

    # ---- per-device readings ------------------------------------------------------------------------

    def utilization(self, uuid: str) -> Utilization:
        u = self._call(self._nvml.nvmlDeviceGetUtilizationRates, self._handle(uuid))
        return Utilization(gpu=float(u.gpu), memory=float(u.memory))

    def memory(self, uuid: str) -> Memory:
        m = self._call(self._nvml.nvmlDeviceGetMemoryInfo, self._handle(uuid))
        return Memory(total_bytes=int(m.total), used_bytes=int(m.used), free_bytes=int(m.free))

    def power_usage_mw(self, uuid: str) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetPowerUsage, self._handle(uuid)))

    def power_limit_mw(self, uuid: str) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetEnforcedPowerLimit, self._handle(uuid)))

    def temperature_c(self, uuid: str) -> int:
        n = self._nvml
        return int(self._call(n.nvmlDeviceGetTemperature, self._handle(uuid), n.NVML_TEMPERATURE_GPU))

    def memory_temperature_c(self, uuid: str) -> int:
        n = self._nvml
        (value,) = self._call(n.nvmlDeviceGetFieldValues, self._handle(uuid), [n.NVML_FI_DEV_MEMORY_TEMP])
        if value.nvmlReturn != n.NVML_SUCCESS:
            raise NvmlError(int(value.nvmlReturn), "memory temperature field")
        return int(_field_value(n, value))

    def temperature_threshold_c(self, uuid: str, threshold: Threshold) -> int:
        n = self._nvml
        kind = {
            Threshold.SLOWDOWN: n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            Threshold.SHUTDOWN: n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        }[threshold]
        return int(self._call(n.nvmlDeviceGetTemperatureThreshold, self._handle(uuid), kind))

    def clock_event_reasons(self, uuid: str) -> int:
        n, handle = self._nvml, self._handle(uuid)
        try:
            return int(self._call(getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None), handle))
        except NvmlError as exc:  # drivers before 535 only have the old name
            if exc.code != NvmlCode.FUNCTION_NOT_FOUND:
                raise
        return int(self._call(n.nvmlDeviceGetCurrentClocksThrottleReasons, handle))

    def sm_clock_mhz(self, uuid: str) -> int:
        n = self._nvml
        return int(self._call(n.nvmlDeviceGetClockInfo, self._handle(uuid), n.NVML_CLOCK_SM))

    def pcie_link(self, uuid: str) -> PcieLink:
        n, handle = self._nvml, self._handle(uuid)
        return PcieLink(
            generation=int(self._call(n.nvmlDeviceGetCurrPcieLinkGeneration, handle)),
            width=int(self._call(n.nvmlDeviceGetCurrPcieLinkWidth, handle)),
            max_generation=int(self._call(n.nvmlDeviceGetMaxPcieLinkGeneration, handle)),  # GPU and slot
            max_width=int(self._call(n.nvmlDeviceGetMaxPcieLinkWidth, handle)),
        )

    def ecc_mode(self, uuid: str) -> EccMode:
        current, pending = self._call(self._nvml.nvmlDeviceGetEccMode, self._handle(uuid))
        return EccMode(current=bool(current), pending=bool(pending))

    def ecc_uncorrected(self, uuid: str, counter: EccCounter) -> int:
        n = self._nvml
        kind = n.NVML_VOLATILE_ECC if counter is EccCounter.VOLATILE else n.NVML_AGGREGATE_ECC
        return int(
            self._call(
                n.nvmlDeviceGetTotalEccErrors, self._handle(uuid), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, kind
            )
        )

    def remapped_rows(self, uuid: str) -> RemappedRows:
        corr, unc, pending, failure = self._call(self._nvml.nvmlDeviceGetRemappedRows, self._handle(uuid))
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def retired_pages_pending(self, uuid: str) -> bool:
        return bool(self._call(self._nvml.nvmlDeviceGetRetiredPagesPendingStatus, self._handle(uuid)))

    def gpm_metrics(self, uuid: str) -> GpmMetrics | None:
        n, dev = self._nvml, self._device(uuid)
        if dev.gpm_supported is None:
            support = self._call(n.nvmlGpmQueryDeviceSupport, dev.parent_handle or dev.handle)
            dev.gpm_supported = bool(support.isSupportedDevice)
        if not dev.gpm_supported:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, "GPM needs Hopper or newer")
        if dev.gpm_samples is None:
            dev.gpm_samples = (self._call(n.nvmlGpmSampleAlloc), self._call(n.nvmlGpmSampleAlloc))
        previous, fresh = dev.gpm_samples
        if dev.info.gpu_instance_id is not None:
            self._call(n.nvmlGpmMigSampleGet, dev.parent_handle, dev.info.gpu_instance_id, fresh)
        else:
            self._call(n.nvmlGpmSampleGet, dev.handle, fresh)
        dev.gpm_samples = (fresh, previous)
        if not dev.gpm_primed:
            dev.gpm_primed = True
            return None
        return self._gpm_between(previous, fresh)

    def compute_pids(self, uuid: str) -> list[int]:
        procs = self._call(self._nvml.nvmlDeviceGetComputeRunningProcesses, self._handle(uuid))
        return [int(p.pid) for p in procs]

    # ---- events -------------------------------------------------------------------------------------

    def open_events(self, uuids: list[str]) -> dict[str, str]:
        n = self._nvml
        wanted = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
        self.close_events()
        self._event_set = self._call(n.nvmlEventSetCreate)
        failed: dict[str, str] = {}
        for uuid in uuids:
            handle = self._handle(uuid)
            try:
                mask = int(self._call(n.nvmlDeviceGetSupportedEventTypes, handle)) & wanted
                if not mask:
                    failed[uuid] = "XID and double-bit ECC events not supported"
                    continue
                self._call(n.nvmlDeviceRegisterEvents, handle, mask, self._event_set)
            except NvmlError as exc:
                failed[uuid] = exc.code_name
        return failed

    def wait_event(self, timeout_s: float) -> NvmlEvent | None:
        n = self._nvml
        if self._event_set is None:
            raise NvmlError(NvmlCode.UNINITIALIZED, "no event set")
        try:
            data = self._call(n.nvmlEventSetWait, self._event_set, int(timeout_s * 1000))
        except NvmlError as exc:
            if exc.code == NvmlCode.TIMEOUT:
                return None
            raise
        uuid = _text(self._call(n.nvmlDeviceGetUUID, data.device))
        kind = EventKind.XID if data.eventType & n.nvmlEventTypeXidCriticalError else EventKind.DBE
        gi = int(data.gpuInstanceId)
        return NvmlEvent(uuid, kind, int(data.eventData), None if gi == _NO_INSTANCE else gi)

    def close_events(self) -> None:
        if self._event_set is not None:
            self._quiet(self._nvml.nvmlEventSetFree, self._event_set)
            self._event_set = None

    # ---- internals ----------------------------------------------------------------------------------

    _GPM_FIELDS = (
        ("graphics_util", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
        ("sm_util", "NVML_GPM_METRIC_SM_UTIL"),
        ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
        ("any_tensor_util", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
        ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
        ("pcie_rx_mib_s", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
        ("pcie_tx_mib_s", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
        ("nvlink_rx_mib_s", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
        ("nvlink_tx_mib_s", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    )

    def _gpm_between(self, first: Any, second: Any) -> GpmMetrics:
        n = self._nvml
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._GPM_FIELDS)
        request.sample1, request.sample2 = first, second
        for i, (_field, const) in enumerate(self._GPM_FIELDS):
            request.metrics[i].metricId = getattr(n, const)
        self._call(n.nvmlGpmMetricsGet, request)
        values: dict[str, float | None] = {}
        for i, (field_name, _const) in enumerate(self._GPM_FIELDS):
            metric = request.metrics[i]
            values[field_name] = float(metric.value) if metric.nvmlReturn == n.NVML_SUCCESS else None
        return GpmMetrics(**values)

    def _remember(self, dev: _Device) -> None:
        with self._lock:
            old = self._devices.get(dev.info.uuid)
            if old is not None:  # keep GPM state across re-enumeration
                dev.gpm_supported, dev.gpm_samples, dev.gpm_primed = (
                    old.gpm_supported,
                    old.gpm_samples,
                    old.gpm_primed,
                )
            self._devices[dev.info.uuid] = dev

    def _device(self, uuid: str) -> _Device:
        dev = self._devices.get(uuid)
        if dev is None:
            raise NvmlError(NvmlCode.NOT_FOUND, f"unknown device {uuid}")
        return dev

    def _handle(self, uuid: str) -> Any:
        return self._device(uuid).handle

    def _call(self, fn: Callable[..., T] | None, *args: Any) -> T:
        if self._nvml is None:
            raise NvmlError(NvmlCode.UNINITIALIZED, "NVML not initialised")
        if fn is None:
            raise NvmlError(NvmlCode.FUNCTION_NOT_FOUND, "nvidia-ml-py lacks this function")
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlError(int(exc.value), str(exc)) from None

    def _quiet(self, fn: Callable[..., object], *args: Any) -> None:
        with contextlib.suppress(NvmlError):
            self._call(fn, *args)


def _field_value(n: Any, value: Any) -> float:
    """Read the union of an nvmlFieldValue_t by its declared type."""
    member = {
        n.NVML_VALUE_TYPE_DOUBLE: "dVal",
        n.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        n.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        n.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        n.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }.get(value.valueType, "uiVal")
    return float(getattr(value.value, member))
