"""Every field the agent reports: its snapshot key, the NVML probe that reads it and its dcgm-exporter name.

The names are dcgm-exporter's so ``/metrics`` can replace the exporter and the Prometheus source reads it
unchanged. The agent keeps them here instead of importing ``engine.model.Signal`` because that module
pulls in pydantic (about 11 MB of RSS on every GPU node); a unit test checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gpu_efficiency.agent.nvml.types import Probe


@dataclass(frozen=True, slots=True)
class Field:
    key: str  # snapshot key, unit in the name
    probe: Probe
    metric: str  # dcgm-exporter metric name
    help: str


FIELDS: Final = (
    Field("gpu_util", Probe.UTILIZATION, "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    Field("mem_copy_util", Probe.UTILIZATION, "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    Field("fb_used_mib", Probe.MEMORY, "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    Field("fb_free_mib", Probe.MEMORY, "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    Field("fb_total_mib", Probe.MEMORY, "DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB)."),
    Field("power_w", Probe.POWER, "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    Field("power_limit_w", Probe.POWER_LIMIT, "DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit (in W)."),
    Field("gpu_temp_c", Probe.TEMPERATURE, "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    Field("memory_temp_c", Probe.MEMORY_TEMPERATURE, "DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
    Field(
        "slowdown_temp_c", Probe.SLOWDOWN_TEMPERATURE, "DCGM_FI_DEV_SLOWDOWN_TEMP", "Slowdown threshold (C)."
    ),
    Field(
        "shutdown_temp_c", Probe.SHUTDOWN_TEMPERATURE, "DCGM_FI_DEV_SHUTDOWN_TEMP", "Shutdown threshold (C)."
    ),
    Field(
        "clock_event_reasons",
        Probe.CLOCK_EVENT_REASONS,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event reasons (bitmask of NVML clocksEventReason*).",
    ),
    Field("sm_clock_mhz", Probe.SM_CLOCK, "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    Field("pcie_link_gen", Probe.PCIE_LINK, "DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe current link generation."),
    Field("pcie_link_width", Probe.PCIE_LINK, "DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe current link width."),
    Field("pcie_max_link_gen", Probe.PCIE_LINK, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "PCIe max link generation."),
    Field("pcie_max_link_width", Probe.PCIE_LINK, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "PCIe max link width."),
    Field("ecc_enabled", Probe.ECC_MODE, "DCGM_FI_DEV_ECC_CURRENT", "ECC mode, current (1 enabled)."),
    Field(
        "ecc_pending_enabled", Probe.ECC_MODE, "DCGM_FI_DEV_ECC_PENDING", "ECC mode after reboot (1 enabled)."
    ),
    Field(
        "ecc_dbe_volatile",
        Probe.ECC_DBE_VOLATILE,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
    ),
    Field(
        "ecc_dbe_aggregate",
        Probe.ECC_DBE_AGGREGATE,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
    ),
    Field(
        "remapped_rows_correctable",
        Probe.REMAPPED_ROWS,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
    ),
    Field(
        "remapped_rows_uncorrectable",
        Probe.REMAPPED_ROWS,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
    ),
    Field(
        "row_remap_pending",
        Probe.REMAPPED_ROWS,
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Row remapping pending (1).",
    ),
    Field(
        "row_remap_failure", Probe.REMAPPED_ROWS, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row remapping failed (1)."
    ),
    Field(
        "retired_pages_pending",
        Probe.RETIRED_PAGES_PENDING,
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Pages pending retirement (NVML reports a flag: 1 when any is pending).",
    ),
    Field(
        "gr_engine_active",
        Probe.GPM,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
    ),
    Field(
        "sm_active",
        Probe.GPM,
        "DCGM_FI_PROF_SM_ACTIVE",
        "Ratio of cycles an SM has at least 1 warp assigned.",
    ),
    Field("sm_occupancy", Probe.GPM, "DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident to the maximum."),
    Field(
        "tensor_active",
        Probe.GPM,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles any tensor pipe is active.",
    ),
    Field(
        "dram_active",
        Probe.GPM,
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the memory interface is active.",
    ),
    Field("pcie_rx_bytes", Probe.GPM, "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received per second."),
    Field("pcie_tx_bytes", Probe.GPM, "DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes transmitted per second."),
    Field("nvlink_rx_bytes", Probe.GPM, "DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second."),
    Field(
        "nvlink_tx_bytes", Probe.GPM, "DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes transmitted per second."
    ),
)

BY_KEY: Final = {f.key: f for f in FIELDS}
PROBE_FIELDS: Final = {p: tuple(f.key for f in FIELDS if f.probe is p) for p in Probe}

#: Probes that mean something on a MIG device; the rest belong to the parent GPU.
MIG_PROBES: Final = (Probe.MEMORY, Probe.GPM)

XID_METRIC: Final = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last XID seen (0: none since the agent started)

#: The signals kept in the rolling history, named as engine.model.Signal names them.
HISTORY_SIGNALS: Final = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    XID_METRIC,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
)
