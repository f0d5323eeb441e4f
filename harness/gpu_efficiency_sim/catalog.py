"""The metrics the simulator serves: dcgm-exporter's names, types, help texts and units.

One ordered table, so the renderer can keep values in flat lists indexed by position instead of
dicts (8,000 GPUs x ~30 metrics a second). Units follow dcgm-exporter: GPU_UTIL and MEM_COPY_UTIL
in percent 0-100, PROF ratios 0-1, framebuffer in MiB, power in W, temperatures in C, PROF PCIe and
NVLink traffic in bytes/s, energy in mJ, ECC and replay counters as counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag
from typing import Final

from gpu_efficiency.engine.model import Signal


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    type: str  # "gauge" | "counter"
    help: str
    integer: bool  # rendered without decimals, as the exporter does for integer DCGM fields
    prof: bool = False  # a DCP profiling field (DCGM_FI_PROF_*)


SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"
MEM_CLOCK: Final = "DCGM_FI_DEV_MEM_CLOCK"
MEM_COPY_UTIL: Final = "DCGM_FI_DEV_MEM_COPY_UTIL"
FB_RESERVED: Final = "DCGM_FI_DEV_FB_RESERVED"
ENERGY: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
PCIE_REPLAY: Final = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
NVLINK_BANDWIDTH_TOTAL: Final = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
ECC_SBE_VOLATILE: Final = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
REMAPPED_ROWS_CORRECTABLE: Final = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
PCIE_LINK: Final = (
    Signal.PCIE_LINK_GEN.value,
    Signal.PCIE_LINK_WIDTH.value,
    Signal.PCIE_MAX_LINK_GEN.value,
    Signal.PCIE_MAX_LINK_WIDTH.value,
)
CLOCK_EVENTS_NEW: Final = Signal.CLOCK_EVENTS.value
CLOCK_EVENTS_OLD: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


def _gauge(name: str, help_text: str, *, integer: bool = True, prof: bool = False) -> MetricDef:
    return MetricDef(str(name), "gauge", help_text, integer, prof)


def _counter(name: str, help_text: str) -> MetricDef:
    return MetricDef(str(name), "counter", help_text, True)


#: The metric table, in exposition order. The clock-events entry uses the new name; the renderer
#: swaps in the old one when asked.
METRICS: Final[tuple[MetricDef, ...]] = (
    _gauge(SM_CLOCK, "SM clock frequency (in MHz)."),
    _gauge(MEM_CLOCK, "Memory clock frequency (in MHz)."),
    _gauge(Signal.MEMORY_TEMP, "Memory temperature (in C)."),
    _gauge(Signal.GPU_TEMP, "GPU temperature (in C)."),
    _gauge(Signal.POWER, "Power draw (in W).", integer=False),
    _counter(ENERGY, "Total energy consumption since boot (in mJ)."),
    _counter(PCIE_REPLAY, "Total number of PCIe retries."),
    _gauge(Signal.GPU_UTIL, "GPU utilization (in %)."),
    _gauge(MEM_COPY_UTIL, "Memory utilization (in %)."),
    _gauge(Signal.XID, "Value of the last XID error encountered."),
    _gauge(Signal.FB_FREE, "Framebuffer memory free (in MiB)."),
    _gauge(Signal.FB_USED, "Framebuffer memory used (in MiB)."),
    _gauge(FB_RESERVED, "Framebuffer memory reserved (in MiB)."),
    _counter(ECC_SBE_VOLATILE, "Total number of single-bit volatile ECC errors."),
    _counter(Signal.ECC_DBE_VOLATILE, "Total number of double-bit volatile ECC errors."),
    _gauge(Signal.RETIRED_PAGES_PENDING, "Number of pages pending retirement."),
    _counter(REMAPPED_ROWS_CORRECTABLE, "Number of remapped rows for correctable errors."),
    _counter(Signal.REMAPPED_ROWS_UNCORRECTABLE, "Number of remapped rows for uncorrectable errors."),
    _gauge(Signal.ROW_REMAP_FAILURE, "Whether remapping of rows has failed."),
    _counter(NVLINK_BANDWIDTH_TOTAL, "Total number of NVLink bandwidth counters for all lanes."),
    _gauge(CLOCK_EVENTS_NEW, "Current clock event reasons (bitmask)."),
    _gauge(Signal.PCIE_MAX_LINK_GEN, "PCIe max link generation."),
    _gauge(Signal.PCIE_MAX_LINK_WIDTH, "PCIe max link width."),
    _gauge(Signal.PCIE_LINK_GEN, "PCIe current link generation."),
    _gauge(Signal.PCIE_LINK_WIDTH, "PCIe current link width."),
    _gauge(Signal.GR_ENGINE_ACTIVE, "Ratio of time the graphics engine is active.", integer=False, prof=True),
    _gauge(Signal.SM_ACTIVE, "Ratio of cycles an SM has at least 1 warp assigned.", integer=False, prof=True),
    _gauge(Signal.SM_OCCUPANCY, "Ratio of number of warps resident on an SM.", integer=False, prof=True),
    _gauge(
        Signal.TENSOR_ACTIVE, "Ratio of cycles the tensor (HMMA) pipe is active.", integer=False, prof=True
    ),
    _gauge(
        Signal.DRAM_ACTIVE, "Ratio of cycles the device memory interface is active.", integer=False, prof=True
    ),
    _gauge(Signal.PCIE_TX_BYTES, "Rate of data transmitted over the PCIe bus (in bytes/s).", prof=True),
    _gauge(Signal.PCIE_RX_BYTES, "Rate of data received over the PCIe bus (in bytes/s).", prof=True),
    _gauge(Signal.NVLINK_TX_BYTES, "Rate of data transmitted over NVLink (in bytes/s).", prof=True),
    _gauge(Signal.NVLINK_RX_BYTES, "Rate of data received over NVLink (in bytes/s).", prof=True),
)

METRIC_NAMES: Final[tuple[str, ...]] = tuple(m.name for m in METRICS)
INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(METRIC_NAMES)}
COUNTERS: Final[frozenset[str]] = frozenset(m.name for m in METRICS if m.type == "counter")

#: PROF fields missing from dcgm-exporter's default CSV, as this project models it (`smActive: false`):
#: only GR_ENGINE_ACTIVE stays among the profiling fields.
OFF_WITHOUT_SM_ACTIVE: Final[frozenset[str]] = frozenset(
    m.name for m in METRICS if m.prof and m.name != Signal.GR_ENGINE_ACTIVE
)

#: Activity metrics that a `garbage: nan` fault without a metric poisons.
ACTIVITY_METRICS: Final[tuple[str, ...]] = tuple(
    str(s)
    for s in (
        Signal.SM_ACTIVE,
        Signal.GR_ENGINE_ACTIVE,
        Signal.GPU_UTIL,
        Signal.SM_OCCUPANCY,
        Signal.TENSOR_ACTIVE,
        Signal.DRAM_ACTIVE,
    )
)


class ClockEvent(IntFlag):
    """NVML clock-event (formerly clock-throttle) reason bits."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCK = 0x100


#: Names accepted in scenario files for clock-event bits (kebab-case of the NVML names).
CLOCK_EVENT_NAMES: Final[dict[str, int]] = {
    flag.name.lower().replace("_", "-"): int(flag) for flag in ClockEvent if flag.name
}

THERMAL_SLOWDOWN_BITS: Final = int(ClockEvent.HW_SLOWDOWN | ClockEvent.SW_THERMAL | ClockEvent.HW_THERMAL)
