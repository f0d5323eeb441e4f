"""What judging and acting on one pod leave behind, kept for ``explain`` and the cycle's plan.

The judge (judge.py) writes the verdict and its evidence, the pod's actions (actions.py) add the
lifecycle, the annotation patch and the events; the planner collects them and ``explain`` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_efficiency.engine.model import PodEvent, PodVerdict, PodView
from gpu_efficiency.engine.reclaim.activity import GPUActivity
from gpu_efficiency.engine.reclaim.idle import Lifecycle
from gpu_efficiency.engine.reclaim.underutilization import Finding


@dataclass(slots=True)
class PodRecord:
    """Everything that led to one pod's verdict and actions (kept for ``explain_pod``)."""

    pod: PodView
    verdict: PodVerdict
    activities: tuple[GPUActivity, ...] = ()
    findings: tuple[Finding, ...] = ()
    sharing: str = ""
    lifecycle: Lifecycle | None = None
    patch: Mapping[str, str | None] = field(default_factory=dict)
    events: tuple[PodEvent, ...] = ()
    owner: str = ""  # its owner, the action and why not (owner-aware reclamation only)
    owner_label: str = ""  # its top owner as KIND/NAME: the notes about the owner (budgets) name it so
