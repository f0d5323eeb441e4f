"""The pod annotations a verdict should leave, and the minimal merge patch to get there.

One unit for every number: a fraction 0-1 with 3 decimals (sm-active, gpu-util and efficiency =
SM activity / GPU util, so "0.450" next to "0.330", never "33").

Steady state makes no writes (safety rule 6): a key is patched only when its value differs, and the
numeric keys are rewritten only when the state or diagnosis changes or the value moved by at least
``NUMERIC_TOLERANCE``: 0.1 of a fraction (the Horizontal Pod Autoscaler's default tolerance is 10 % too).
Window averages of a steady workload scatter, most with short windows: at 5 points the scale
bench (2-minute window, 8,000 simulated pods) patched an efficiency, a ratio of two noisy averages
whose written value is also rounded, in 3 of 36 steady cycles. The numbers are evidence for the
diagnosis, not a live gauge (the exporter's metrics are that): a 0.1 lag is the price of not
patching pods for noise.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import Diagnosis, PodVerdict, Signal, Verdict
from gpu_efficiency.engine.reclaim.underutilization import RECOMMENDATIONS

#: Smallest change of a numeric annotation worth a write, per key.
NUMERIC_TOLERANCE: Mapping[str, float] = {names.SM_ACTIVE: 0.1, names.GPU_UTIL: 0.1, names.EFFICIENCY: 0.1}
STATE_WARNED = "Warned"
#: Plain strings of enum members (``.value`` is a slow descriptor, and annotations want plain str).
_TEXT: Mapping[Verdict | Diagnosis | Signal, str] = {
    member: member.value for enum in (Verdict, Diagnosis, Signal) for member in enum
}


def state_value(verdict: Verdict, warned: bool) -> str:
    """The state annotation: the verdict, or Warned for an idle pod carrying evict-after."""
    return STATE_WARNED if warned and verdict is Verdict.IDLE else _TEXT[verdict]


def _fraction(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def desired_annotations(
    verdict: PodVerdict, state: str, policy_name: str, current: Mapping[str, str]
) -> dict[str, str | None]:
    """Operator annotations for this verdict; None removes a key.

    An Unknown pod keeps its last known diagnosis and numbers (only the state says Unknown), so data
    gaps do not churn annotations or repeat GPUUnderutilized events when data comes back. A pod that
    never had a diagnosis gets the verdict's own recommendation (warming up until when, or what to
    check), kept current while it stays without one.
    """
    if verdict.verdict is Verdict.UNKNOWN:
        desired: dict[str, str | None] = {names.STATE: state, names.POLICY: policy_name}
        insufficient = _TEXT[Diagnosis.INSUFFICIENT_DATA]
        if current.get(names.DIAGNOSIS, insufficient) == insufficient:
            desired[names.DIAGNOSIS] = insufficient
            desired[names.RECOMMENDATION] = (
                verdict.recommendation or RECOMMENDATIONS[Diagnosis.INSUFFICIENT_DATA]
            )
        return desired
    efficiency = verdict.efficiency
    return {
        names.STATE: state,
        names.SM_ACTIVE: _fraction(verdict.activity_avg),
        names.ACTIVITY_SIGNAL: _TEXT[verdict.activity_signal] if verdict.activity_signal else None,
        names.GPU_UTIL: _fraction(verdict.gpu_util_avg),
        names.EFFICIENCY: None
        if efficiency is None
        else _fraction(efficiency / 100.0),  # a percent in the engine
        names.DIAGNOSIS: _TEXT[verdict.diagnosis],
        names.RECOMMENDATION: verdict.recommendation or None,
        names.POLICY: policy_name,
    }


def _close(old: str, new: str, tolerance: float) -> bool:
    try:
        return abs(float(old) - float(new)) < tolerance
    except ValueError:
        return False


def annotation_patch(current: Mapping[str, str], desired: Mapping[str, str | None]) -> dict[str, str | None]:
    """Keys whose value must change (None: remove), applying the numeric tolerance."""
    settled = current.get(names.STATE) == desired.get(names.STATE) and (
        names.DIAGNOSIS not in desired or current.get(names.DIAGNOSIS) == desired[names.DIAGNOSIS]
    )
    patch: dict[str, str | None] = {}
    for key, value in desired.items():
        old = current.get(key)
        if value is None:
            if old is not None:
                patch[key] = None
        elif old != value:
            tolerance = NUMERIC_TOLERANCE.get(key)
            if settled and old is not None and tolerance is not None and _close(old, value, tolerance):
                continue
            patch[key] = value
    return patch


def cleanup_patch(current: Mapping[str, str]) -> dict[str, str | None]:
    """Remove every annotation the operator writes (the pod left the policy's scope)."""
    return {key: None for key in names.OPERATOR_POD_ANNOTATIONS if key in current}
