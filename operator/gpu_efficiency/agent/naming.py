"""Which dcgm-exporter generation's names, units and node label ``/metrics`` serves (``--exporter-names``).

Admins' dashboards and alerts query the names of the exporter they run, so the agent, which can
stand in for dcgm-exporter, serves one generation's presentation of its readings. Only ``/metrics``
changes: the JSON snapshot, the history and the node condition keep the agent's own keys and units.
Names and units come from the shared table ``api/exporter_fields.py``; the four agent-only fields it
does not list are renamed per the same DCGM 4.6 alias block (NVIDIA/DCGM ``dcgmlib/dcgm_fields.h``).

Default ``4.8.3+``: the newest dcgm-exporter whose series can be checked in public sources. Its
release line 4.5.3-4.8.2 (NVIDIA/dcgm-exporter, May 2026) serves the DCGM <= 4.5 names, and main after
it renames ``Hostname`` to ``hostname`` (#655), released with DCGM 4.6.0 (NVIDIA/DCGM v4.6.0, July 2026).
The DCGM 4.6+ names of ``4.9+`` need DCGM 4.7, which no public source shows yet, and NVIDIA's own
Grafana dashboard (``grafana/dcgm-exporter-dashboard.json``) queries the DCGM <= 4.5 names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation, Unit

#: The generations ``--exporter-names`` accepts (default-csv is a choice of fields, not of names).
AGENT_GENERATIONS: Final = (Generation.LEGACY, Generation.V4, Generation.V4_8_3, Generation.V4_9)
DEFAULT_NAMES: Final = Generation.V4_8_3

#: Fields the agent serves that the shared table does not list, renamed in DCGM 4.6 (dcgm_fields.h:
#: ``#define DCGM_FI_DEV_POWER_MGMT_LIMIT DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS`` and so on).
_AGENT_RENAMES: Final = (
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS"),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS"),
    ("DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS"),
    ("DCGM_FI_DEV_ECC_CURRENT", "DCGM_FI_DEV_ECC_MODE"),
)
#: FB_TOTAL is not in the table; it is served in FB_USED's unit.
_FB_TOTAL: Final = "DCGM_FI_DEV_FB_TOTAL"

_FACTORS: Final[Mapping[tuple[Unit, Unit], float]] = {
    (Unit.PERCENT, Unit.RATIO): 0.01,
    (Unit.MHZ, Unit.HZ): 1e6,
    (Unit.MIB, Unit.BYTES): 1024.0 * 1024.0,
}
_UNIT_WORDS: Final[Mapping[Unit, tuple[str, str]]] = {
    Unit.RATIO: ("(in %)", "(ratio 0-1)"),
    Unit.HZ: ("(in MHz)", "(in Hz)"),
    Unit.BYTES: ("(in MiB)", "(in bytes)"),
}


@dataclass(frozen=True, slots=True)
class Naming:
    """How ``/metrics`` presents the agent's readings (keyed by the agent's own DCGM <= 4.5 names)."""

    generation: Generation
    node_label: str
    names: Mapping[str, str]
    scale: Mapping[str, float]
    help_words: Mapping[str, tuple[str, str]]  # name -> (old unit words, new) in its help text

    def name(self, metric: str) -> str:
        return self.names.get(metric, metric)

    def value(self, metric: str, value: float) -> float:
        factor = self.scale.get(metric)
        return value if factor is None else value * factor

    def help(self, metric: str, text: str) -> str:
        words = self.help_words.get(metric)
        return text if words is None else text.replace(*words)


def naming(generation: Generation | str = DEFAULT_NAMES) -> Naming:
    """The presentation of one generation; ValueError naming the accepted values otherwise."""
    allowed = [g.value for g in AGENT_GENERATIONS]
    if str(generation) not in allowed:
        raise ValueError(f"unknown exporter generation {str(generation)!r}; use one of {', '.join(allowed)}")
    gen = Generation(generation)
    spec = ef.GENERATIONS[gen]
    names: dict[str, str] = {}
    scale: dict[str, float] = {}
    words: dict[str, tuple[str, str]] = {}
    for field in ef.FIELDS:
        served = spec.name(field.signal)
        if served != field.legacy:
            names[field.legacy] = served
        unit = spec.unit(field.signal)
        factor = _FACTORS.get((field.legacy_unit, unit))
        if factor is not None:
            scale[field.legacy] = factor
            words[field.legacy] = _UNIT_WORDS[unit]
    if spec.family is ef.Family.CURRENT:
        names.update(dict(ef.EXTRA_RENAMES))
        names.update(dict(_AGENT_RENAMES))
        fb_used = ef.FIELDS_BY_SIGNAL["FB_USED"].legacy
        if fb_used in scale:
            scale[_FB_TOTAL] = scale[fb_used]
            words[_FB_TOTAL] = words[fb_used]
    return Naming(gen, spec.node_label, names, scale, words)
