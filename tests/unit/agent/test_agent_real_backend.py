"""The nvidia-ml-py backend without a GPU: the real ``pynvml`` module with its C entry points replaced by a
small simulated driver, so argument order, unit handling, error mapping, the clock-event fallback, MIG
enumeration, GPM sample swapping and event decoding are checked here; tests/gpu runs it on hardware."""

# ruff: noqa: N802  (the simulated driver's methods carry pynvml's names)

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpu_efficiency.agent.collect import Collector
from gpu_efficiency.agent.fields import FIELDS
from gpu_efficiency.agent.nvml.real import PynvmlBackend
from gpu_efficiency.agent.nvml.types import EventKind, NvmlCode, NvmlError


def test_init_without_a_driver_is_a_clean_error() -> None:
    """On this machine there is no libnvidia-ml: the real call fails, mapped to our error."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on GPU machines
        pynvml.nvmlShutdown()
        pytest.skip("a driver is present; tests/gpu covers this machine")
    with pytest.raises(NvmlError) as err:
        PynvmlBackend().init()
    assert err.value.code in (NvmlCode.LIBRARY_NOT_FOUND, NvmlCode.DRIVER_NOT_LOADED)


class _Driver:
    """Two GPUs: 0 a Hopper with one MIG instance, 1 an older GPU without GPM or the new clock call."""

    def __init__(self) -> None:
        self.gpm_samples: list[tuple[Any, str]] = []  # (sample pointer, what it sampled)
        self.events: list[Any] = []
        self.registered: list[tuple[str, int]] = []

    @staticmethod
    def fail(code: int) -> None:
        raise pynvml.NVMLError(code)

    # lifecycle and enumeration
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return {"h0": "GPU-0", "h1": "GPU-1", "m0": "MIG-0"}[h]

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3 MIG 1g.10gb" if h == "m0" else b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        if h == "h1":
            self.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, slot: int) -> str:
        if slot == 1:
            self.fail(pynvml.NVML_ERROR_NOT_FOUND)
        return "m0"

    def nvmlDeviceGetGpuInstanceId(self, h: str) -> int:
        return 7

    def nvmlDeviceGetComputeInstanceId(self, h: str) -> int:
        return 0

    # readings
    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=88, memory=12)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        mib = 1024 * 1024
        return SimpleNamespace(total=1000 * mib, used=250 * mib, free=750 * mib)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 123456

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700000

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 55

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        assert ids == [pynvml.NVML_FI_DEV_MEMORY_TEMP]
        value = pynvml.c_nvmlFieldValue_t()
        value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        value.nvmlReturn = pynvml.NVML_SUCCESS if h == "h0" else pynvml.NVML_ERROR_NOT_SUPPORTED
        value.value.uiVal = 61
        return [value]

    def nvmlDeviceGetTemperatureThreshold(self, h: str, kind: int) -> int:
        return {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 87,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
        }[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        if h == "h1":
            self.fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # driver older than 535
        return 0x40

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:
        return 0x20

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return 1755

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        return 1  # idle: power saving

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        return 8

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetEccMode(self, h: str) -> list[int]:
        return [1, 0]

    def nvmlDeviceGetTotalEccErrors(self, h: str, error_type: int, counter: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return {pynvml.NVML_VOLATILE_ECC: 2, pynvml.NVML_AGGREGATE_ECC: 9}[counter]

    def nvmlDeviceGetRemappedRows(self, h: str) -> tuple[int, int, int, int]:
        return (4, 1, 1, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: str) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=4242, usedGpuMemory=1)]

    # GPM
    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return SimpleNamespace(isSupportedDevice=int(h == "h0"))

    def nvmlGpmSampleAlloc(self) -> Any:
        return ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleFree(self, sample: Any) -> None: ...

    def nvmlGpmSampleGet(self, h: str, sample: Any) -> Any:
        self.gpm_samples.append((sample, h))
        return sample

    def nvmlGpmMigSampleGet(self, h: str, gi: int, sample: Any) -> Any:
        self.gpm_samples.append((sample, f"{h}/gi{gi}"))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        newest, previous = self.gpm_samples[-1][0], self.gpm_samples[-2][0]
        address = ctypes.addressof
        assert address(request.sample1.contents) == address(previous.contents)  # older first
        assert address(request.sample2.contents) == address(newest.contents)
        values = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
            pynvml.NVML_GPM_METRIC_SM_UTIL: 75.0,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 20.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 50.0,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 1.0,
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 2.0,
            pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 3.0,
        }  # NVLink TX left out: reported as failed
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            found = values.get(metric.metricId)
            metric.nvmlReturn = pynvml.NVML_SUCCESS if found is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            metric.value = found or 0.0
        return request

    # events
    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetSupportedEventTypes(self, h: str) -> int:
        xid, dbe = pynvml.nvmlEventTypeXidCriticalError, pynvml.nvmlEventTypeDoubleBitEccError
        return xid | dbe | pynvml.nvmlEventTypePState if h == "h0" else pynvml.nvmlEventTypePState

    def nvmlDeviceRegisterEvents(self, h: str, mask: int, event_set: str) -> None:
        self.registered.append((h, mask))

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            self.fail(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None: ...


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Driver]:
    d = _Driver()
    for name in dir(d):
        if name.startswith("nvml"):
            monkeypatch.setattr(pynvml, name, getattr(d, name))
    return d


def test_real_backend_reads_every_field(driver: _Driver) -> None:
    backend = PynvmlBackend()
    backend.init()
    assert backend.driver_version() == "550.54.15"
    gpus = backend.devices()
    assert [(g.index, g.uuid, g.name, g.pci_bus_id) for g in gpus] == [
        (0, "GPU-0", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
        (1, "GPU-1", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
    ]
    (mig,) = backend.mig_devices(gpus[0])
    assert (mig.uuid, mig.parent_uuid, mig.gpu_instance_id, mig.mig_profile) == (
        "MIG-0",
        "GPU-0",
        7,
        "1g.10gb",
    )
    with pytest.raises(NvmlError) as err:
        backend.mig_devices(gpus[1])
    assert err.value.not_supported
    collector = Collector(backend)
    collector.read(gpus[0])
    reading = collector.read(gpus[0])
    assert set(reading.values) | set(reading.failures) == {f.key for f in FIELDS}
    assert reading.failures == {"nvlink_tx_bytes": "NVML_GPM_METRIC_UNAVAILABLE"}
    v = reading.values
    assert v["sm_clock_mhz"] == 1755
    link = (v["pcie_link_gen"], v["pcie_link_width"], v["pcie_max_link_gen"], v["pcie_max_link_width"])
    assert link == (1, 8, 5, 16)
    assert (v["gpu_util"], v["fb_used_mib"], v["power_w"], v["power_limit_w"]) == (
        88.0,
        250.0,
        123.456,
        700.0,
    )
    assert (v["gpu_temp_c"], v["memory_temp_c"], v["slowdown_temp_c"], v["shutdown_temp_c"]) == (
        55,
        61,
        87,
        92,
    )
    assert (v["clock_event_reasons"], v["ecc_dbe_volatile"], v["ecc_dbe_aggregate"]) == (0x40, 2, 9)
    assert (v["remapped_rows_uncorrectable"], v["row_remap_pending"], v["retired_pages_pending"]) == (
        1,
        1.0,
        0.0,
    )
    assert (v["sm_active"], v["gr_engine_active"], v["pcie_rx_bytes"]) == (0.75, 0.9, 1024 * 1024)
    assert backend.compute_pids("GPU-0") == [4242]


def test_real_backend_fallbacks_and_gpm_paths(driver: _Driver) -> None:
    backend = PynvmlBackend()
    backend.init()
    gpus = backend.devices()
    (mig,) = backend.mig_devices(gpus[0])
    old = Collector(backend).read(gpus[1])
    assert old.values["clock_event_reasons"] == 0x20  # fell back to the throttle-reasons call
    assert old.failures["memory_temp_c"] == "NVML_ERROR_NOT_SUPPORTED"  # the field's own return code
    assert old.failures["sm_active"] == "NVML_ERROR_NOT_SUPPORTED"  # no GPM before Hopper
    assert backend.gpm_metrics("MIG-0") is None
    assert backend.gpm_metrics("MIG-0") is not None
    assert backend.gpm_metrics("MIG-0") is not None  # buffers swap: each call pairs the last two samples
    assert [what for _, what in driver.gpm_samples] == ["h0/gi7"] * 3
    assert mig.is_mig


def test_real_backend_events(driver: _Driver) -> None:
    backend = PynvmlBackend()
    backend.init()
    backend.devices()
    failed = backend.open_events(["GPU-0", "GPU-1"])
    assert failed == {"GPU-1": "XID and double-bit ECC events not supported"}
    xid, dbe = pynvml.nvmlEventTypeXidCriticalError, pynvml.nvmlEventTypeDoubleBitEccError
    assert driver.registered == [("h0", xid | dbe)]  # only the wanted, supported types
    assert backend.wait_event(0.01) is None  # NVML_ERROR_TIMEOUT is no event, not an error
    driver.events = [
        SimpleNamespace(device="h0", eventType=xid, eventData=79, gpuInstanceId=0xFFFFFFFF),
        SimpleNamespace(device="h0", eventType=dbe, eventData=0, gpuInstanceId=7),
    ]
    first, second = backend.wait_event(0.01), backend.wait_event(0.01)
    assert first is not None
    assert second is not None
    assert (first.uuid, first.kind, first.data, first.gpu_instance_id) == ("GPU-0", EventKind.XID, 79, None)
    assert (second.kind, second.gpu_instance_id) == (EventKind.DBE, 7)
    backend.shutdown()
    with pytest.raises(NvmlError):
        backend.wait_event(0.01)
