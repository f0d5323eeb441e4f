"""The records one evaluation leaves behind: the plan plus, for one focused pod, how it was judged.

The planner writes them and ``explain`` reads them, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_efficiency.engine.model import Plan
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.record import PodRecord


@dataclass(slots=True)
class Evaluation:
    plan: Plan
    params: CycleParams
    record: PodRecord | None  # the focused pod's record, when one was asked for
    exclusion: str  # why the focused pod is out of scope ('' when in scope or not asked)
