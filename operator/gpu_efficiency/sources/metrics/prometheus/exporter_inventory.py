"""Which dcgm-exporter generation each GPU speaks, and which signals its exporter serves.

One instant query, one series per GPU, sent where an exporter may have changed
(``inventory_cache.py``): for each feature (a name family, a node label, a
fault kind's or diagnosis input's signals) ``group by (UUID, GPU_I_ID)`` of its selector times a
power of two, summed per GPU into a bitmask. Decided per GPU, never per cluster: a fleet mid-upgrade
serves several generations at once. Names and generations: ``api/exporter_fields.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency.engine import DropReason
from gpu_efficiency.sources.metrics.base import DropTally
from gpu_efficiency.sources.metrics.labels import valid_key
from gpu_efficiency.sources.metrics.prometheus.promql import Query, union

_KEYS = "UUID, GPU_I_ID"
_TAG = "gpueff_has"
#: Signals whose name tells the family (renamed in DCGM 4.6, and served by every generation but
#: the default CSV's lack of profiling).
_FAMILY_SIGNALS = ("GPU_UTIL", "GR_ENGINE_ACTIVE", "SM_ACTIVE", "GPU_TEMP", "POWER")
_IDENTITY_SIGNALS = ("GPU_UTIL", "GR_ENGINE_ACTIVE", "SM_ACTIVE", "FB_USED")


def _names(signals: Sequence[str], family: ef.Family | None = None) -> tuple[str, ...]:
    out: list[str] = []
    for signal in signals:
        spec = ef.FIELDS_BY_SIGNAL[signal]
        if family is not ef.Family.CURRENT:
            out.append(spec.legacy)
            if signal == "CLOCK_EVENTS":
                out.append(ef.OLD_CLOCK_EVENTS)
        if family is not ef.Family.LEGACY:
            out.append(spec.current)
    return tuple(dict.fromkeys(out))


#: Diagnosis inputs (``engine/reclaim/underutilization.py``) and the signals that serve each.
DIAGNOSIS_INPUTS: Mapping[str, tuple[str, ...]] = {
    "profiling": ("SM_ACTIVE", "GR_ENGINE_ACTIVE"),
    "occupancy": ("SM_OCCUPANCY",),
    "tensor": ("TENSOR_ACTIVE",),
    "dram": ("DRAM_ACTIVE",),
    "pcie-throughput": ("PCIE_RX_BYTES", "PCIE_TX_BYTES"),
    "memory": ("FB_USED",),
    "power": ("POWER",),
    "clock-events": ("CLOCK_EVENTS",),
}

#: (feature, metric names, extra matcher): one bit each, in this order.
FEATURES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("legacy-names", _names(_FAMILY_SIGNALS, ef.Family.LEGACY), ""),
    (
        "current-names",
        tuple(
            n
            for n in _names(_FAMILY_SIGNALS, ef.Family.CURRENT)
            if n not in _names(_FAMILY_SIGNALS, ef.Family.LEGACY)
        ),
        "",
    ),
    ("throttle-name", (ef.OLD_CLOCK_EVENTS,), ""),
    ("xid-count", (ef.XID_COUNT,), ""),
    ("label-hostname", _names(_IDENTITY_SIGNALS), f'{ef.NODE_LABEL}!=""'),
    ("label-Hostname", _names(_IDENTITY_SIGNALS), f'{ef.OLD_NODE_LABEL}!=""'),
    *(
        (kind, _names(signals) + ((ef.XID_COUNT,) if kind == "xid" else ()), "")
        for kind, signals in ef.FAULT_KIND_SIGNALS.items()
    ),
    *((name, _names(signals), "") for name, signals in DIAGNOSIS_INPUTS.items()),
)
BITS = {name: 1 << i for i, (name, _, _) in enumerate(FEATURES)}
#: What a GPU is blind to when its exporter serves none of these (fault kinds, then inputs).
BLIND_SPOTS = (*ef.FAULT_KIND_SIGNALS, *DIAGNOSIS_INPUTS)
#: Inputs a 4.9+ GPU serves only under a name whose unit public sources leave ambiguous there (MiB
#: or bytes): the source drops them (``windows.drop_ambiguous``), so they are blind, not healthy.
UNREADABLE_ON_4_9 = frozenset(
    name
    for name, signals in DIAGNOSIS_INPUTS.items()
    if all(ef.FIELDS_BY_SIGNAL[s].unit_ambiguous and not ef.FIELDS_BY_SIGNAL[s].renamed for s in signals)
)


def inventory_query(matchers: str = "") -> str:
    """The bitmask of served features per GPU (see the module docstring)."""
    terms = []
    for name, metrics, extra in FEATURES:
        labels = ",".join(m for m in (matchers, extra) if m)
        sel = '{__name__=~"' + "|".join(metrics) + '"' + (f",{labels}" if labels else "") + "}"
        bit = BITS[name]
        terms.append(f'label_replace(group by ({_KEYS}) ({sel}) * {bit}, "{_TAG}", "{name}", "", "")')
    return f"sum by ({_KEYS}) ({union(terms)})"


def query(matchers: str = "") -> Query:
    """The inventory as a cycle query (one, whatever the number of GPUs)."""
    return Query(window=None, text=inventory_query(matchers), inventory=True)


@dataclass(frozen=True, slots=True)
class ExporterView:
    """What one GPU's exporter speaks and serves."""

    generation: Generation
    blind: frozenset[str]  # fault kinds and diagnosis inputs none of whose signals it serves
    xid_counter: bool = False  # serves DCGM_EXP_XID_ERRORS_COUNT: XIDs are counted exactly


def view_of(mask: int) -> ExporterView:
    """A GPU's generation and blind spots from its feature bitmask."""

    def has(name: str) -> bool:
        return bool(mask & BITS[name])

    if has("current-names"):
        generation = Generation.V4_9
    elif not has("ecc") and not has("occupancy"):
        generation = Generation.DEFAULT_CSV
    elif has("throttle-name"):
        generation = Generation.LEGACY
    elif has("label-hostname") or has("xid-count"):
        generation = Generation.V4_8_3
    elif has("legacy-names"):
        generation = Generation.V4
    else:
        generation = Generation.UNKNOWN
    blind = frozenset(spot for spot in BLIND_SPOTS if not has(spot))
    if generation is Generation.V4_9:
        blind |= UNREADABLE_ON_4_9
    return ExporterView(generation, blind, has("xid-count"))


def inventory(
    series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally | None = None
) -> dict[tuple[str, str], ExporterView]:
    """The inventory query's answer: each GPU key's view (malformed identifiers dropped)."""
    out: dict[tuple[str, str], ExporterView] = {}
    for labels, value in series:
        key = (labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
        if not valid_key(*key):
            if drops is not None:
                drops.add(DropReason.INVALID_ID)
            continue
        if value != value or value < 0 or value >= 1 << len(FEATURES):  # NaN or not a mask
            continue
        out[key] = view_of(int(value))
    return out
