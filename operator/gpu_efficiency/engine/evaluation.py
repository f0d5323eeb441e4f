"""The records one evaluation leaves behind: the plan plus, for one focused pod, how it was judged.

The planner writes them and ``explain`` reads them, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_efficiency.engine.model import Plan, PodEvent, PodVerdict, PodView
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.pods.activity import GPUActivity
from gpu_efficiency.engine.pods.idle import Lifecycle
from gpu_efficiency.engine.pods.underutilization import Finding


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


@dataclass(slots=True)
class Evaluation:
    plan: Plan
    params: CycleParams
    record: PodRecord | None  # the focused pod's record, when one was asked for
    exclusion: str  # why the focused pod is out of scope ('' when in scope or not asked)
