"""The metric names, units and labels of every dcgm-exporter generation (shared data, no logic).

One table for the operator (which reads every generation), the node agent (which serves one) and
the harness simulator (which plays each). Sources, checked in the public repositories:

- DCGM field names: NVIDIA/DCGM ``dcgmlib/dcgm_fields.h`` at tag v4.6.0
  (51b65ccebf9d61e6593713a7d6b68e594d9d7975): the ``DCGM_DEPRECATED`` alias block at the end of
  the file maps every pre-4.6 name to its 4.6 name ("renamed per DCGM Field Naming Standard",
  ``dcgmlib/dcgm_field_naming.py``).
- dcgm-exporter names, units and the exporter's own counters: NVIDIA/dcgm-exporter
  ``etc/default-counters.csv`` and ``etc/dcp-metrics-included.csv`` at tag 4.5.3-4.8.2
  (691c92762eb551313c825f6efe4ceeee20982801), ``internal/pkg/collector/xid_collector.go``,
  ``clock_events_collector.go`` and ``expcollector.go`` (the ``xid`` / ``clock_event`` /
  ``window_size_in_ms`` labels; a 5-minute default window, ``pkg/cmd/app.go``).
- The ``Hostname`` -> ``hostname`` label: NVIDIA/dcgm-exporter commit d5e5f510a1b6b393f39a43293ccd9dc985defc79
  "Rename Hostname label to hostname (#655)" (``internal/pkg/rendermetrics/render_metrics.go``).

Ambiguities (both readings accepted, see ``FieldSpec.current_units``):

- ``DCGM_FI_DEV_GPU_UTIL_RATIO``: the name and dcgm-exporter 4.9's notes (as quoted in issue 30)
  say a 0-1 ratio, but DCGM 4.6 still fills field 203 with NVML's 0-100 integer
  (``dcgmlib/src/DcgmCacheManager.cpp``, ``case DCGM_FI_DEV_GPU_UTIL_RATIO``). Read as a ratio: the
  reading that can never make a busy GPU look idle (a percent value read as a ratio is at least as
  high, and anything above 1 is out of range, hence Unknown).
- ``DCGM_FI_DEV_SM_CLOCK``, ``DCGM_FI_DEV_FB_USED`` / ``FB_FREE``: DCGM 4.6 keeps these names (MHz,
  "in MB"); the 4.9 notes quoted in issue 30 say clocks move to Hz and memory to bytes, but no
  dcgm-exporter 4.9 source was available to check. On a GPU of the 4.9+ generation their unit
  cannot be known from the name, so the operator does not read them as amounts there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Family(StrEnum):
    """Which DCGM field naming a series uses."""

    LEGACY = "dcgm-4.5"  # names up to DCGM 4.5 (dcgm-exporter up to 4.8.x)
    CURRENT = "dcgm-4.6"  # DCGM 4.6+ names (dcgm-exporter 4.9+, built on DCGM 4.7)


class Unit(StrEnum):
    PERCENT = "percent"  # 0-100
    RATIO = "ratio"  # 0-1
    MIB = "MiB"
    BYTES = "bytes"
    MHZ = "MHz"
    HZ = "Hz"
    WATTS = "W"
    CELSIUS = "C"
    BYTES_PER_SECOND = "bytes/s"
    COUNT = "count"  # a counter of events (ECC errors, remapped rows, PCIe replays)
    BITMASK = "bitmask"  # clock-event reasons (DCGM_CLOCKS_EVENT_REASON_*)
    XID = "xid"  # the value is an XID number (the last one seen)
    FLAG = "flag"  # 0 or 1
    GENERATION = "generation"  # PCIe generation
    LANES = "lanes"  # PCIe link width


class Generation(StrEnum):
    """What one GPU's exporter speaks, as told by the names and labels it serves."""

    LEGACY = "legacy"  # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS + Hostname
    V4 = "4.x"  # dcgm-exporter 4.x up to 4.8.2: CLOCKS_EVENT_REASONS + Hostname
    V4_8_3 = "4.8.3+"  # hostname label + DCGM_EXP_XID_ERRORS_COUNT / DCGM_EXP_CLOCK_EVENTS_COUNT
    V4_9 = "4.9+"  # DCGM 4.6+ names (and units) + hostname
    DEFAULT_CSV = "default-csv"  # the default CSV: no profiling fields, no ECC counters
    UNKNOWN = "unknown"  # none of the above could be told (no identity metric served)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One signal the operator reads: its name and unit in each family.

    ``signal`` is the engine's ``Signal`` member name (``engine/model.py``). ``current_units`` lists
    every unit a public source gives for the current name (more than one: ambiguous, see the module
    docstring); the first is the one the operator reads it in.
    """

    signal: str
    legacy: str
    legacy_unit: Unit
    current: str
    current_units: tuple[Unit, ...]
    kind: str  # what it serves: activity, diagnosis, memory, power, clock, thermal, ecc, xid, rowremap, pcie

    @property
    def renamed(self) -> bool:
        return self.legacy != self.current

    @property
    def unit_ambiguous(self) -> bool:
        return len(self.current_units) > 1


_P, _R = Unit.PERCENT, Unit.RATIO

#: Every signal the operator queries (``sources/metrics/prometheus/promql.py`` QUERY_PLAN), legacy and current.
FIELDS: Final[tuple[FieldSpec, ...]] = (
    FieldSpec("SM_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", _R, "DCGM_FI_PROF_SM_UTIL_RATIO", (_R,), "activity"),
    FieldSpec(
        "GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        _R,
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        (_R,),
        "activity",
    ),
    FieldSpec("GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL", _P, "DCGM_FI_DEV_GPU_UTIL_RATIO", (_R, _P), "activity"),
    FieldSpec(
        "SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY", _R, "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", (_R,), "diagnosis"
    ),
    FieldSpec(
        "TENSOR_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        _R,
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        (_R,),
        "diagnosis",
    ),
    FieldSpec(
        "DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", _R, "DCGM_FI_PROF_DRAM_UTIL_RATIO", (_R,), "diagnosis"
    ),
    # Not renamed in DCGM 4.6 (dcgm_fields.h: DCGM_FI_PROF_PCIE_*_BYTES 1009/1010, NVLINK 1011/1012).
    FieldSpec(
        "PCIE_RX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        Unit.BYTES_PER_SECOND,
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        (Unit.BYTES_PER_SECOND,),
        "diagnosis",
    ),
    FieldSpec(
        "PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        Unit.BYTES_PER_SECOND,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        (Unit.BYTES_PER_SECOND,),
        "diagnosis",
    ),
    FieldSpec(
        "NVLINK_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        Unit.BYTES_PER_SECOND,
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        (Unit.BYTES_PER_SECOND,),
        "diagnosis",
    ),
    FieldSpec(
        "NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        Unit.BYTES_PER_SECOND,
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        (Unit.BYTES_PER_SECOND,),
        "diagnosis",
    ),
    # Same names in DCGM 4.6 ("in MB"); 4.9's notes (issue 30) say bytes: ambiguous.
    FieldSpec(
        "FB_USED", "DCGM_FI_DEV_FB_USED", Unit.MIB, "DCGM_FI_DEV_FB_USED", (Unit.BYTES, Unit.MIB), "memory"
    ),
    FieldSpec(
        "FB_FREE", "DCGM_FI_DEV_FB_FREE", Unit.MIB, "DCGM_FI_DEV_FB_FREE", (Unit.BYTES, Unit.MIB), "memory"
    ),
    FieldSpec(
        "POWER",
        "DCGM_FI_DEV_POWER_USAGE",
        Unit.WATTS,
        "DCGM_FI_DEV_BOARD_POWER_WATTS",
        (Unit.WATTS,),
        "power",
    ),
    # Same name in DCGM 4.6; 4.9's notes (issue 30) say Hz: ambiguous.
    FieldSpec(
        "SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK", Unit.MHZ, "DCGM_FI_DEV_SM_CLOCK", (Unit.HZ, Unit.MHZ), "clock"
    ),
    FieldSpec(
        "GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        Unit.CELSIUS,
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        (Unit.CELSIUS,),
        "thermal",
    ),
    FieldSpec(
        "MEMORY_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        Unit.CELSIUS,
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
        (Unit.CELSIUS,),
        "thermal",
    ),
    # The legacy generation serves DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (OLD_CLOCK_EVENTS), a C alias
    # of field 112 since DCGM 3.x; 4.x exporters serve CLOCKS_EVENT_REASONS, unchanged in 4.6.
    FieldSpec(
        "CLOCK_EVENTS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        Unit.BITMASK,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        (Unit.BITMASK,),
        "thermal",
    ),
    FieldSpec(
        "ECC_DBE_VOLATILE",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Unit.COUNT,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        (Unit.COUNT,),
        "ecc",
    ),
    FieldSpec("XID", "DCGM_FI_DEV_XID_ERRORS", Unit.XID, "DCGM_FI_DEV_XID_ERROR", (Unit.XID,), "xid"),
    FieldSpec(
        "REMAPPED_ROWS_UNCORRECTABLE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Unit.COUNT,
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        (Unit.COUNT,),
        "rowremap",
    ),
    FieldSpec(
        "ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Unit.FLAG,
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
        (Unit.FLAG,),
        "rowremap",
    ),
    FieldSpec(
        "RETIRED_PAGES_PENDING",
        "DCGM_FI_DEV_RETIRED_PENDING",
        Unit.COUNT,
        "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
        (Unit.COUNT,),
        "ecc",
    ),
    FieldSpec(
        "PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        Unit.GENERATION,
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        (Unit.GENERATION,),
        "pcie",
    ),
    FieldSpec(
        "PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        Unit.LANES,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        (Unit.LANES,),
        "pcie",
    ),
    FieldSpec(
        "PCIE_MAX_LINK_GEN",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        Unit.GENERATION,
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        (Unit.GENERATION,),
        "pcie",
    ),
    FieldSpec(
        "PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        Unit.LANES,
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        (Unit.LANES,),
        "pcie",
    ),
)

#: Renamed fields the operator does not query but the simulator / agent serve (default CSV).
EXTRA_RENAMES: Final[tuple[tuple[str, str], ...]] = (
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
    ("DCGM_FI_DEV_POWER_USAGE_INSTANT", "DCGM_FI_DEV_BOARD_POWER_RAW_WATTS"),
)

FIELDS_BY_SIGNAL: Final = {spec.signal: spec for spec in FIELDS}

#: The clock-event bitmask's name before DCGM 3.x renamed it (still a C alias of field 112).
OLD_CLOCK_EVENTS: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

#: dcgm-exporter's own counters (``etc/default-counters.csv``, commented out by default): the
#: number of XIDs (label ``xid``) and clock events (label ``clock_event``) seen in the last
#: ``window_size_in_ms`` (default 300000), one series per value seen. Not a monotonic counter:
#: a value drops as events leave the window.
XID_COUNT: Final = "DCGM_EXP_XID_ERRORS_COUNT"
XID_LABEL: Final = "xid"
CLOCK_EVENTS_COUNT: Final = "DCGM_EXP_CLOCK_EVENTS_COUNT"
CLOCK_EVENT_LABEL: Final = "clock_event"
WINDOW_LABEL: Final = "window_size_in_ms"

#: Labels naming a GPU's node, in the order the operator trusts them: dcgm-exporter's own
#: (``hostname`` since #655, ``Hostname`` before), then what a scrape config adds.
NODE_LABELS: Final = ("hostname", "Hostname", "kubernetes_node", "node", "nodename")
OLD_NODE_LABEL: Final = "Hostname"
NODE_LABEL: Final = "hostname"

#: Profiling (DCP, ``DCGM_FI_PROF_*``) fields: all absent in the default-CSV variant, which models a
#: CSV (or a GPU without DCP) serving none of them. dcgm-exporter's real default CSV serves
#: GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE and PCIE_*_BYTES but not SM_ACTIVE or
#: SM_OCCUPANCY (``etc/default-counters.csv``): the operator tells either by its missing
#: SM_OCCUPANCY and ECC counters.
PROFILING_SIGNALS: Final = (
    "SM_ACTIVE",
    "GR_ENGINE_ACTIVE",
    "SM_OCCUPANCY",
    "TENSOR_ACTIVE",
    "DRAM_ACTIVE",
    "PCIE_RX_BYTES",
    "PCIE_TX_BYTES",
    "NVLINK_RX_BYTES",
    "NVLINK_TX_BYTES",
)
#: Fault signals by kind (a GPU whose exporter serves none of a kind's signals is blind to it).
FAULT_KIND_SIGNALS: Final[dict[str, tuple[str, ...]]] = {
    "ecc": ("ECC_DBE_VOLATILE",),
    "xid": ("XID",),
    "thermal": ("GPU_TEMP", "MEMORY_TEMP", "CLOCK_EVENTS"),
    "pcie": ("PCIE_LINK_GEN", "PCIE_LINK_WIDTH", "PCIE_MAX_LINK_GEN", "PCIE_MAX_LINK_WIDTH"),
    "rowremap": ("REMAPPED_ROWS_UNCORRECTABLE", "ROW_REMAP_FAILURE"),
}


#: What each generation serves, for the simulator and the compatibility table.
@dataclass(frozen=True, slots=True)
class GenerationSpec:
    generation: Generation
    family: Family
    node_label: str
    clock_events_name: str
    exporter_counters: bool  # DCGM_EXP_XID_ERRORS_COUNT / DCGM_EXP_CLOCK_EVENTS_COUNT
    profiling: bool
    ecc: bool

    def name(self, signal: str) -> str:
        """The metric name this generation serves ``signal`` under."""
        if signal == "CLOCK_EVENTS":
            return self.clock_events_name
        spec = FIELDS_BY_SIGNAL[signal]
        return spec.current if self.family is Family.CURRENT else spec.legacy

    def unit(self, signal: str) -> Unit:
        """The unit this generation serves ``signal`` in (current family: the first reading)."""
        spec = FIELDS_BY_SIGNAL[signal]
        return spec.current_units[0] if self.family is Family.CURRENT else spec.legacy_unit


_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
GENERATIONS: Final[dict[Generation, GenerationSpec]] = {
    Generation.LEGACY: GenerationSpec(
        Generation.LEGACY, Family.LEGACY, "Hostname", OLD_CLOCK_EVENTS, False, True, True
    ),
    Generation.V4: GenerationSpec(Generation.V4, Family.LEGACY, "Hostname", _EVENTS, False, True, True),
    Generation.V4_8_3: GenerationSpec(
        Generation.V4_8_3, Family.LEGACY, "hostname", _EVENTS, True, True, True
    ),
    Generation.V4_9: GenerationSpec(Generation.V4_9, Family.CURRENT, "hostname", _EVENTS, True, True, True),
    Generation.DEFAULT_CSV: GenerationSpec(
        Generation.DEFAULT_CSV, Family.LEGACY, "hostname", _EVENTS, False, False, False
    ),
}

#: The CSV lines (dcgm-exporter's ``-f`` file: field, type, help) that turn on each fault kind.
CSV_LINES: Final[dict[str, tuple[str, ...]]] = {
    "ecc": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.",),
    "xid": (
        "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.",
        "DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window",
    ),
    "thermal": (
        "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).",
        "DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, Current clock event reasons.",
    ),
    "pcie": (
        "DCGM_FI_DEV_PCIE_LINK_GEN, gauge, PCIe current link generation.",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH, gauge, PCIe current link width.",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN, gauge, PCIe max link generation.",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH, gauge, PCIe max link width.",
    ),
    "rowremap": (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed",
    ),
    "profiling": (
        "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned.",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.",
    ),
}
