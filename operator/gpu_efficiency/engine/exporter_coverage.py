"""What the exporters serve for a policy's GPUs: generations, blind spots, GPUs tied to no node.

Blind is not healthy: a fault kind (ecc, xid, thermal, pcie, rowremap) or diagnosis input whose
signals a GPU's exporter does not serve is unknown for that GPU, and the policy says so in its
``SignalsComplete`` condition, with one event each time the set of blind spots changes (GPU counts
churn with the fleet; a new blind kind is news). The generations are counted in the status
(``exporterGenerations``) and logged by the runtime once per change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.exporter_fields import CSV_LINES, NODE_LABELS
from gpu_efficiency.api.status import Condition
from gpu_efficiency.engine.conditions import find_condition, set_condition
from gpu_efficiency.engine.model import GPUSample, PolicyEvent

#: MetricsAvailable's reason when no GPU's series name its node.
NO_NODE_LABELS = "NoNodeLabels"
#: The order blind spots are listed in (fault kinds first: they decide taints).
ORDER = (
    "ecc",
    "xid",
    "thermal",
    "pcie",
    "rowremap",
    "profiling",
    "occupancy",
    "tensor",
    "dram",
    "pcie-throughput",
    "memory",
    "power",
    "clock-events",
)


@dataclass(frozen=True, slots=True)
class Coverage:
    generations: Mapping[str, int]  # generation -> GPUs
    blind: Mapping[str, int]  # fault kind or diagnosis input -> GPUs blind to it
    gpus: int  # GPUs with samples
    nodeless: int  # GPUs whose series name no node
    labels_seen: tuple[str, ...]  # the labels the nodeless GPUs' series do carry


def coverage(gpus: Sequence[GPUSample]) -> Coverage:
    """Count generations, blind spots and node-less GPUs (GPUs without an inventory: not counted)."""
    generations: Counter[str] = Counter()
    blind: Counter[str] = Counter()
    seen: set[str] = set()
    nodeless = 0
    for gpu in gpus:
        if gpu.exporter:
            generations[gpu.exporter] += 1
            blind.update(gpu.blind)
        if not gpu.node:
            nodeless += 1
            seen.update(gpu.labels_seen)
    ordered = {spot: blind[spot] for spot in ORDER if blind[spot]}
    ordered.update({spot: n for spot, n in sorted(blind.items()) if spot not in ordered})
    return Coverage(dict(sorted(generations.items())), ordered, len(gpus), nodeless, tuple(sorted(seen)))


def blind_summary(blind: Mapping[str, int]) -> str:
    """``ecc 3 GPUs, pcie 3 GPUs`` (the order of ``ORDER``)."""
    return ", ".join(f"{spot} {n} GPU{'' if n == 1 else 's'}" for spot, n in blind.items())


def _reason(blind: Mapping[str, int]) -> str:
    """A condition reason naming the blind kinds and their GPU counts: ``Blind:ecc:3,pcie:3``
    (Kubernetes allows ``:`` and ``,`` in a reason; ``-`` becomes ``_``)."""
    return "Blind:" + ",".join(f"{spot.replace('-', '_')}:{n}" for spot, n in blind.items())


def csv_lines(blind: Mapping[str, int]) -> list[str]:
    """The dcgm-exporter CSV lines that would serve these blind spots (fault kinds and profiling)."""
    out: list[str] = []
    for spot in blind:
        key = "profiling" if spot in ("profiling", "occupancy", "tensor", "dram") else spot
        for line in CSV_LINES.get(key, ()):
            if line not in out:
                out.append(line)
    return out


def signals_condition(
    conditions: Sequence[Condition], cover: Coverage, now: float, generation: int
) -> tuple[list[Condition], list[PolicyEvent]]:
    """SignalsComplete, and a Warning event when the set of blind spots changes (Normal when none
    remains)."""
    previous = find_condition(conditions, names.COND_SIGNALS)
    before = _spots(previous.reason) if previous is not None and previous.status == "False" else set()
    if not cover.blind:
        events = []
        if before:
            events.append(
                PolicyEvent(
                    reason=names.EV_SIGNALS_COMPLETE,
                    message="every fault kind and diagnosis input is served for every GPU",
                )
            )
        updated = set_condition(
            conditions,
            type=names.COND_SIGNALS,
            status="True",
            reason="AllSignalsServed",
            message=f"every fault kind and diagnosis input is served for the {cover.gpus} GPUs",
            now=now,
            generation=generation,
        )
        return updated, events
    message = (
        f"blind (the exporter serves none of the signals; unknown, never healthy): {blind_summary(cover.blind)}; "
        "add the missing fields to dcgm-exporter's CSV (gpu-efficiency report lists the lines)"
    )
    events = []
    if set(cover.blind) != before:
        events.append(PolicyEvent(reason=names.EV_SIGNALS_INCOMPLETE, message=message, type="Warning"))
    updated = set_condition(
        conditions,
        type=names.COND_SIGNALS,
        status="False",
        reason=_reason(cover.blind),
        message=message,
        now=now,
        generation=generation,
    )
    return updated, events


def _spots(reason: str) -> set[str]:
    """The blind spots a ``_reason`` names."""
    listed = reason.removeprefix("Blind:")
    return {part.split(":", 1)[0].replace("_", "-") for part in listed.split(",") if part}


def nodeless(cover: Coverage) -> str:
    """Why no GPU can be tied to a node ('' when one can): a missing-metrics condition, naming the
    labels the series do carry, since every pod on them stays Unknown."""
    if not cover.gpus or cover.nodeless < cover.gpus:
        return ""
    found = ", ".join(cover.labels_seen) or "none"
    return (
        f"{cover.gpus} GPUs have samples but none names its node: their series carry none of the labels "
        f"{', '.join(NODE_LABELS)} (labels found: {found}); add one to the scrape config "
        "(a relabeling of __meta_kubernetes_pod_node_name) or upgrade dcgm-exporter"
    )
