"""Is this fault new? Fingerprints decide, so a fault already handled never acts twice.

A detection is compared with a reference: the fingerprint recorded for the same GPU when the held
fault was detected, or the baseline left by a manual recovery. It is *new* when:

- ecc: a value that shows the fault is above the reference (one more DBE, another remapped row,
  a remap failure or pending page that was not there);
- xid: the XID differs from the reference, or the reference is older than the lookback plus one
  scrape, so the change seen in the window must be a later one;
- thermal, straggler, pcie: never within one episode (the reference lives until the GPU is healthy again).

A GPU without a reference is always new. Counter resets (a GPU reset, a reboot) lower ECC references
so the next real error counts again.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState


def is_new(
    judgement: GpuJudgement,
    reference: Mapping[str, float] | None,
    reference_at: float | None,
    *,
    now: float,
    xid_memory_s: float,
) -> bool:
    """Whether a FAULT judgement goes beyond what ``reference`` (detected at ``reference_at``) covers."""
    if reference is None:
        return True
    if judgement.kind is FaultKind.ECC:
        return any(judgement.fingerprint[k] > reference.get(k, 0.0) for k in judgement.triggered)
    if judgement.kind is FaultKind.XID:
        if judgement.fingerprint.get("xid") != reference.get("xid"):
            return True
        return reference_at is None or now >= reference_at + xid_memory_s
    return False


def lowered(reference: Mapping[str, float], judgement: GpuJudgement) -> dict[str, float]:
    """An ECC reference after counter resets: values now below it drop to the window's floor.

    Keys that reach zero are dropped (nothing left to suppress). Only clean readings lower.
    """
    out: dict[str, float] = {}
    for key, value in reference.items():
        current = judgement.fingerprint.get(key)
        if current is not None and current < value:
            value = min(value, judgement.floors.get(key, current))
        if value > 0:
            out[key] = value
    return out


def baseline_expired(kind: FaultKind, judgement: GpuJudgement | None) -> bool:
    """Whether a thermal, straggler or PCIe baseline's GPU is healthy again (its episode is over)."""
    return (
        kind in (FaultKind.THERMAL, FaultKind.STRAGGLER, FaultKind.PCIE)
        and judgement is not None
        and judgement.state is GpuState.HEALTHY
    )
