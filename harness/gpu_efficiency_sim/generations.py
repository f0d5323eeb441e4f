"""How each dcgm-exporter generation presents the simulator's readings: names, units, node label.

The simulator computes every reading in one canonical form (``catalog``: the DCGM <= 4.5 names in
dcgm-exporter 4.x units); a generation is applied at exposition time, per node, so one scenario can
mix generations as a fleet does mid-upgrade. Names, units, node labels and which generations serve
the ``DCGM_EXP_*`` counters come from the shared table ``gpu_efficiency.api.exporter_fields`` (with
its sources); this module only turns them into what the renderer needs, plus two facts the table
leaves to the simulator:

- the fields of dcgm-exporter's shipped ``etc/default-counters.csv`` (NVIDIA/dcgm-exporter, tag
  4.5.3-4.8.2 and main after #655): ECC, retired pages, clock events, PCIe link state, SM_ACTIVE,
  SM_OCCUPANCY, the NVLink PROF rates and the ``DCGM_EXP_*`` counters are commented out, while
  GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE and the PCIe PROF rates are on;
- the units of the three fields the table does not list (MEM_CLOCK, FB_RESERVED, energy), taken as
  their siblings' (SM_CLOCK, FB_USED) and, for energy, as 4.9's notes say (J).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation, Unit
from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog

#: What the simulator can serve: every generation but ``unknown`` (the operator's "could not tell").
SIMULATED: Final[tuple[Generation, ...]] = tuple(g for g in Generation if g is not Generation.UNKNOWN)
#: Today's behaviour (DCGM <= 4.5 names, CLOCKS_EVENT_REASONS, ``Hostname``): existing scenarios,
#: their PromQL expectations and the demo keep working unchanged.
DEFAULT_EXPORTER: Final = Generation.V4

#: dcgm-exporter's default --xid-count-window-size and --clock-events-count-window-size (5 minutes).
COUNT_WINDOW_MS: Final = 300_000

#: Catalog fields that dcgm-exporter's etc/default-counters.csv leaves commented out.
NOT_IN_DEFAULT_CSV: Final[frozenset[str]] = frozenset(
    {
        Signal.SM_ACTIVE,
        Signal.SM_OCCUPANCY,
        Signal.NVLINK_RX_BYTES,
        Signal.NVLINK_TX_BYTES,
        catalog.ECC_SBE_VOLATILE,
        Signal.ECC_DBE_VOLATILE,
        Signal.RETIRED_PAGES_PENDING,
        catalog.CLOCK_EVENTS_NEW,
        *catalog.PCIE_LINK,
    }
)

#: Value factor from the catalog's unit to another (the only conversions any generation needs).
_FACTORS: Final[Mapping[tuple[Unit, Unit], float]] = {
    (Unit.PERCENT, Unit.RATIO): 0.01,
    (Unit.MHZ, Unit.HZ): 1e6,
    (Unit.MIB, Unit.BYTES): 1024.0 * 1024.0,
}
#: Fields outside the shared table, unit-wise like their siblings: (canonical name, sibling signal).
_SIBLINGS: Final = ((catalog.MEM_CLOCK, "SM_CLOCK"), (catalog.FB_RESERVED, "FB_USED"))
_ENERGY_J_PER_MJ: Final = 1e-3

_HELP_UNITS: Final[Mapping[Unit, str]] = {
    Unit.RATIO: "ratio 0-1",
    Unit.HZ: "in Hz",
    Unit.BYTES: "in bytes",
}


@dataclass(frozen=True, slots=True)
class Presentation:
    """One generation as the renderer applies it to catalog readings."""

    generation: Generation
    node_label: str  # "Hostname" or "hostname"
    names: Mapping[str, str]  # catalog name -> served name, where it differs
    scale: Mapping[str, float]  # catalog value x factor, where the unit differs
    omitted: frozenset[str]  # catalog names not served at all
    counts: bool  # serves DCGM_EXP_XID_ERRORS_COUNT and DCGM_EXP_CLOCK_EVENTS_COUNT

    def name(self, canonical: str) -> str:
        return self.names.get(canonical, canonical)

    def serves(self, canonical: str) -> bool:
        return canonical not in self.omitted

    def help(self, canonical: str, default: str) -> str:
        """The catalog's help text, its unit rewritten where this generation serves another."""
        if canonical not in self.scale:
            return default
        unit = self.unit_label(canonical)
        head = default.split(" (in ", 1)[0].rstrip(".")
        return f"{head} ({unit})."

    def unit_label(self, canonical: str) -> str:
        if canonical == catalog.ENERGY:
            return "in J"
        signal = _signal_of(canonical)
        spec = ef.GENERATIONS[self.generation]
        return _HELP_UNITS.get(spec.unit(signal), str(spec.unit(signal)))


def _signal_of(canonical: str) -> str:
    """The shared table's signal name of a catalog field (its sibling's for MEM_CLOCK, FB_RESERVED)."""
    for name, sibling in _SIBLINGS:
        if canonical == name:
            return sibling
    return Signal(canonical).name


def _present(generation: Generation) -> Presentation:
    spec = ef.GENERATIONS[generation]
    names: dict[str, str] = {}
    scale: dict[str, float] = {}
    for field in ef.FIELDS:
        canonical = str(Signal[field.signal])
        served = spec.name(field.signal)
        if served != canonical:
            names[canonical] = served
        factor = _FACTORS.get((field.legacy_unit, spec.unit(field.signal)))
        if factor is not None:
            scale[canonical] = factor
    if spec.family is ef.Family.CURRENT:
        names.update(dict(ef.EXTRA_RENAMES))
        for canonical, sibling in _SIBLINGS:
            if str(Signal[sibling]) in scale:
                scale[canonical] = scale[str(Signal[sibling])]
        scale[catalog.ENERGY] = _ENERGY_J_PER_MJ
    omitted = NOT_IN_DEFAULT_CSV if generation is Generation.DEFAULT_CSV else frozenset()
    return Presentation(generation, spec.node_label, names, scale, omitted, spec.exporter_counters)


PRESENTATIONS: Final[Mapping[Generation, Presentation]] = {g: _present(g) for g in SIMULATED}


def presentation(version: Generation | str) -> Presentation:
    """The presentation of a generation value; a clear error naming the accepted values otherwise."""
    try:
        return PRESENTATIONS[Generation(version)]
    except (ValueError, KeyError):
        raise ValueError(
            f"unknown exporter generation {version!r}; use one of {', '.join(g.value for g in SIMULATED)}"
        ) from None


def xid_count_labels(window_ms: int, xid: int | None) -> str:
    """The extra labels of one DCGM_EXP_XID_ERRORS_COUNT series (no ``xid`` on the zero series)."""
    extra = f',{ef.WINDOW_LABEL}="{window_ms}"'
    return extra + (f',{ef.XID_LABEL}="{xid}"' if xid is not None else "")


def clock_event_count_labels(window_ms: int, event: str | None) -> str:
    """The extra labels of one DCGM_EXP_CLOCK_EVENTS_COUNT series (no ``clock_event`` on the zero one)."""
    extra = f',{ef.WINDOW_LABEL}="{window_ms}"'
    return extra + (f',{ef.CLOCK_EVENT_LABEL}="{event}"' if event else "")


#: dcgm-exporter's clock_event label values per NVML bit (clock_events_collector.go).
CLOCK_EVENT_LABELS: Final[Mapping[int, str]] = {
    0x1: "gpu_idle",
    0x2: "clocks_setting",
    0x4: "power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
