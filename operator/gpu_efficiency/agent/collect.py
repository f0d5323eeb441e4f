"""Read every field of one GPU through the backend, in dcgm-exporter units, never raising.

A probe that fails leaves its fields absent for that sample; the first failure of each (GPU, probe, code)
is logged once, so an unsupported field is said once per process, not once per second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_efficiency.agent.fields import MIG_PROBES, PROBE_FIELDS
from gpu_efficiency.agent.nvml.types import (
    DeviceInfo,
    EccCounter,
    NvmlBackend,
    NvmlError,
    Probe,
    Threshold,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One sample of one device. ``values`` holds only the fields that were read successfully."""

    device: DeviceInfo
    timestamp: float  # unix seconds
    values: Mapping[str, float]  # field key (see agent.fields) -> value in dcgm-exporter units
    failures: Mapping[str, str]  # field key -> NVML error name, for fields absent from this sample


def _pct_to_ratio(v: float | None) -> float | None:
    return None if v is None else v / 100.0


def _mib_s_to_bytes(v: float | None) -> float | None:
    return None if v is None else v * MIB


def _gpm(b: NvmlBackend, u: str) -> dict[str, float | None]:
    g = b.gpm_metrics(u)
    if g is None:  # first sample: GPM needs an interval
        return {}
    return {
        "gr_engine_active": _pct_to_ratio(g.graphics_util),
        "sm_active": _pct_to_ratio(g.sm_util),
        "sm_occupancy": _pct_to_ratio(g.sm_occupancy),
        "tensor_active": _pct_to_ratio(g.any_tensor_util),
        "dram_active": _pct_to_ratio(g.dram_bw_util),
        "pcie_rx_bytes": _mib_s_to_bytes(g.pcie_rx_mib_s),
        "pcie_tx_bytes": _mib_s_to_bytes(g.pcie_tx_mib_s),
        "nvlink_rx_bytes": _mib_s_to_bytes(g.nvlink_rx_mib_s),
        "nvlink_tx_bytes": _mib_s_to_bytes(g.nvlink_tx_mib_s),
    }


def _utilization(b: NvmlBackend, u: str) -> dict[str, float | None]:
    x = b.utilization(u)
    return {"gpu_util": x.gpu, "mem_copy_util": x.memory}


def _memory(b: NvmlBackend, u: str) -> dict[str, float | None]:
    m = b.memory(u)
    return {
        "fb_used_mib": m.used_bytes / MIB,
        "fb_free_mib": m.free_bytes / MIB,
        "fb_total_mib": m.total_bytes / MIB,
    }


def _pcie_link(b: NvmlBackend, u: str) -> dict[str, float | None]:
    link = b.pcie_link(u)
    return {
        "pcie_link_gen": link.generation,
        "pcie_link_width": link.width,
        "pcie_max_link_gen": link.max_generation,
        "pcie_max_link_width": link.max_width,
    }


def _ecc_mode(b: NvmlBackend, u: str) -> dict[str, float | None]:
    m = b.ecc_mode(u)
    return {"ecc_enabled": float(m.current), "ecc_pending_enabled": float(m.pending)}


def _remapped(b: NvmlBackend, u: str) -> dict[str, float | None]:
    r = b.remapped_rows(u)
    return {
        "remapped_rows_correctable": r.correctable,
        "remapped_rows_uncorrectable": r.uncorrectable,
        "row_remap_pending": float(r.pending),
        "row_remap_failure": float(r.failure),
    }


_PROBES: Mapping[Probe, Callable[[NvmlBackend, str], dict[str, float | None]]] = {
    Probe.UTILIZATION: _utilization,
    Probe.MEMORY: _memory,
    Probe.POWER: lambda b, u: {"power_w": b.power_usage_mw(u) / 1000.0},
    Probe.POWER_LIMIT: lambda b, u: {"power_limit_w": b.power_limit_mw(u) / 1000.0},
    Probe.TEMPERATURE: lambda b, u: {"gpu_temp_c": b.temperature_c(u)},
    Probe.MEMORY_TEMPERATURE: lambda b, u: {"memory_temp_c": b.memory_temperature_c(u)},
    Probe.SLOWDOWN_TEMPERATURE: lambda b, u: {
        "slowdown_temp_c": b.temperature_threshold_c(u, Threshold.SLOWDOWN)
    },
    Probe.SHUTDOWN_TEMPERATURE: lambda b, u: {
        "shutdown_temp_c": b.temperature_threshold_c(u, Threshold.SHUTDOWN)
    },
    Probe.CLOCK_EVENT_REASONS: lambda b, u: {"clock_event_reasons": b.clock_event_reasons(u)},
    Probe.SM_CLOCK: lambda b, u: {"sm_clock_mhz": b.sm_clock_mhz(u)},
    Probe.PCIE_LINK: _pcie_link,
    Probe.ECC_MODE: _ecc_mode,
    Probe.ECC_DBE_VOLATILE: lambda b, u: {"ecc_dbe_volatile": b.ecc_uncorrected(u, EccCounter.VOLATILE)},
    Probe.ECC_DBE_AGGREGATE: lambda b, u: {"ecc_dbe_aggregate": b.ecc_uncorrected(u, EccCounter.AGGREGATE)},
    Probe.REMAPPED_ROWS: _remapped,
    Probe.RETIRED_PAGES_PENDING: lambda b, u: {"retired_pages_pending": float(b.retired_pages_pending(u))},
    Probe.GPM: _gpm,
}


class Collector:
    """Turns backend calls into ``GpuReading``s. One per agent; safe to call from one thread at a time."""

    def __init__(self, backend: NvmlBackend, clock: Callable[[], float] = time.time) -> None:
        self._backend = backend
        self._clock = clock
        self._said: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    def read(self, device: DeviceInfo) -> GpuReading:
        values: dict[str, float] = {}
        failures: dict[str, str] = {}
        for probe in MIG_PROBES if device.is_mig else _PROBES:
            try:
                got = _PROBES[probe](self._backend, device.uuid)
            except NvmlError as exc:
                self._say_once(device, probe, exc)
                failures.update(dict.fromkeys(PROBE_FIELDS[probe], exc.code_name))
                continue
            for key, value in got.items():
                if value is None:
                    failures[key] = "NVML_GPM_METRIC_UNAVAILABLE"
                else:
                    values[key] = value
        return GpuReading(device, self._clock(), values, failures)

    def _say_once(self, device: DeviceInfo, probe: Probe, exc: NvmlError) -> None:
        key = (device.uuid, probe.value, exc.code)
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        fields = ", ".join(PROBE_FIELDS[probe])
        level = logging.INFO if exc.not_supported else logging.WARNING
        log.log(
            level,
            "GPU %s (%s): %s failed with %s; reporting %s absent (said once)",
            device.label_index,
            device.uuid,
            probe.value,
            exc,
            fields,
        )
