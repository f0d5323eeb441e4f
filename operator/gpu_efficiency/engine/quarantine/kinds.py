"""Fault kinds, their severity order, condition reasons, and the shape of one GPU's judgement.

Severity orders the circuit breaker's choice (a corrupting ECC error beats a hot GPU) and makes
messages deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum


class FaultKind(StrEnum):
    """A fault kind: also the taint value and the key in the node's fault record."""

    ECC = "ecc"
    XID = "xid"
    THERMAL = "thermal"
    STRAGGLER = (
        "straggler"  # a hardware straggler of its job (engine/stragglers/evaluate.py): degraded, not broken
    )
    PCIE = "pcie"  # a PCIe link trained below the GPU's maximum (engine/quarantine/pcie.py): degraded

    @property
    def severity(self) -> int:
        """Lower is worse: ECC corrupts results, an XID usually kills jobs, heat slows them, and a
        straggler slows the one job it is in, a narrower PCIe link only its host transfers."""
        return _SEVERITY[self]

    @property
    def condition_reason(self) -> str:
        """GPUHealthy=False (GPUDegraded=True for a degraded kind) reason when this kind is the only one held."""
        return _REASONS[self]

    @property
    def degraded(self) -> bool:
        """Reported on the GPUDegraded condition, not GPUHealthy: the GPU works, only slower than it should."""
        return self in (FaultKind.STRAGGLER, FaultKind.PCIE)


_SEVERITY: Mapping[FaultKind, int] = {
    FaultKind.ECC: 0,
    FaultKind.XID: 1,
    FaultKind.THERMAL: 2,
    FaultKind.STRAGGLER: 3,
    FaultKind.PCIE: 4,
}
_REASONS: Mapping[FaultKind, str] = {
    FaultKind.ECC: "GPUFaultECC",
    FaultKind.XID: "GPUFaultXID",
    FaultKind.THERMAL: "GPUFaultThermal",
    FaultKind.STRAGGLER: "GPUDegradedStraggler",
    FaultKind.PCIE: "GPUDegradedPCIe",
}

#: Kinds in severity order.
KINDS: tuple[FaultKind, ...] = tuple(sorted(FaultKind, key=lambda k: k.severity))

#: GPUHealthy=False reason when several kinds are held at once.
REASON_MULTIPLE = "GPUFaultMultiple"
#: GPUDegraded=True reason when several degraded kinds are held at once.
REASON_DEGRADED_MULTIPLE = "GPUDegradedMultiple"
#: GPUHealthy=True reason once the operator's last fault on the node is gone.
REASON_CLEARED = "GPUFaultCleared"
#: Every reason the operator writes on GPUHealthy=False: only these are ours to flip back to True.
FAULT_REASON_PREFIX = "GPUFault"
#: GPUDegraded=False reason once no degraded kind is held any more.
REASON_DEGRADED_CLEARED = "GPUDegradedCleared"
#: Every reason the operator writes on GPUDegraded=True: only these are ours to flip back to False.
DEGRADED_REASON_PREFIX = "GPUDegraded"


def kind_of(text: str) -> FaultKind | None:
    """The kind named by ``text`` (case-insensitive), or None."""
    try:
        return FaultKind(text.strip().lower())
    except ValueError:
        return None


class GpuState(StrEnum):
    """One GPU's state for one fault kind in this cycle."""

    FAULT = "fault"  # clean data shows the fault
    HEALTHY = "healthy"  # clean data shows no fault: enough to recover
    PENDING = "pending"  # clean data, neither a fault nor healthy (e.g. hot, but not for long enough)
    UNKNOWN = "unknown"  # missing, stale, sparse or garbage data: never a fault, never a recovery


@dataclass(frozen=True, slots=True)
class GpuJudgement:
    """The evidence behind one GPU's state: values for messages, a fingerprint to tell new faults."""

    kind: FaultKind
    node: str
    uuid: str
    index: str
    state: GpuState
    summary: str = ""  # short evidence for messages ("dbe=3 (+1)", "xid=79")
    reason: str = ""  # why UNKNOWN or PENDING, for notes
    fingerprint: Mapping[str, float] = field(default_factory=dict)  # newest values of clean signals
    floors: Mapping[str, float] = field(default_factory=dict)  # lowest values in the window
    triggered: tuple[str, ...] = ()  # fingerprint keys that show the fault
    #: Newest sample time of the GPU's fault windows: a fault seen in a sample newer than its
    #: detection was seen twice (safety rule 9's second reading where no second source exists).
    newest: float = math.nan
    #: Whether the GPU's second source (``GPUSample.witness``) shows the same state of a fault:
    #: True both do, False one shows it and the other's clean reading does not, None no second
    #: clean reading. A drain or NoExecute waits while it is False.
    agrees: bool | None = None


def merge_judgements(judgements: list[GpuJudgement]) -> GpuJudgement:
    """One judgement for a GPU seen by several sources (Prometheus and the node agent).

    Any source showing the fault wins (the agent is faster). Otherwise clean data beats no data (a
    source without a window, e.g. the agent without thermal windows, does not veto a recovery),
    and among clean sources the more cautious PENDING beats HEALTHY.
    """
    by_state = {j.state: j for j in reversed(judgements)}
    for state in (GpuState.FAULT, GpuState.PENDING, GpuState.HEALTHY):
        if state in by_state:
            return by_state[state]
    return judgements[0]


def with_witness(own: GpuJudgement, witness: GpuJudgement | None) -> GpuJudgement:
    """``own`` merged with the second source's judgement of the same GPU (``merge_judgements``),
    saying whether they agree on a fault (``GpuJudgement.agrees``)."""
    if witness is None:
        return own
    merged = merge_judgements([own, witness])
    if GpuState.FAULT not in (own.state, witness.state) or GpuState.UNKNOWN in (own.state, witness.state):
        return merged
    return replace(merged, agrees=own.state is witness.state)
