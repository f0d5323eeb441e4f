"""Pod verdicts kept from the previous cycle for pods whose inputs did not change.

A steady cycle hands the engine the same activity windows for most GPUs (the tiered Prometheus
source carries them, ``GPUSample.carried_newest``), and judging those pods again gives the same
verdict. The memo keeps each pod's judgement with exactly what it was computed from: per GPU its
UUID, activity window, data bounds and framebuffer total, and the cycle's parameters. It gives it
back only when all of these are equal, so a plan made with the memo is the plan made without it,
and a cycle's judging cost follows what changed rather than the cluster's size.

Only pods whose every GPU's window is carried are memoised: a window fetched this cycle is new
and would not be seen again, and keeping it would hold a second cycle's Stats in memory. What a
judgement also depends on is checked outside it, every cycle: the pod's age (warm-up) and other
pods on the same GPUs (shared pods are never memoised).

Lifecycle, annotations and events depend on the clock and are recomputed from the verdict, except
for a quiet pod: one judged Active, Efficient or Underutilized that carries no idle-lifecycle
annotation, whose actions wrote nothing. Its actions read only its own view (annotations, name,
uid), the verdict and the parameters (``actions.act``, ``idle.idle_lifecycle``'s first return), not
the clock, its owner or the idle ledger. When the next cycle hands over the same pod view (the
cluster cache keeps a view until the pod changes) and the memo gives back the same verdict, its
actions are again nothing, and are not recomputed: at 8,000 steady pods that is most of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_efficiency.engine.model import PodVerdict, PodView, Signal, Stats
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.activity import DataBounds, GPUActivity
from gpu_efficiency.engine.reclaim.idle import PodKey
from gpu_efficiency.engine.reclaim.underutilization import Finding

#: Per GPU of the pod, in the order judged: UUID, activity window, data bounds, framebuffer MiB.
JudgeInputs = tuple[tuple[str, Mapping[Signal, Stats], DataBounds, float | None], ...]


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: PodVerdict
    activities: tuple[GPUActivity, ...]
    findings: tuple[Finding, ...]


class JudgeMemo:
    """One policy's judgements of its previous cycle (the handler keeps one per policy).

    Windows are compared by value; the same object (a carried window) compares in O(1). Only the
    judgements used or made in the latest cycle are kept, so pods that left are forgotten.
    """

    __slots__ = ("_current", "_params", "_previous", "_quiet", "_was_quiet", "hits", "misses", "quiet")

    def __init__(self) -> None:
        self._params: CycleParams | None = None
        self._previous: dict[PodKey, tuple[JudgeInputs, Judgement]] = {}
        self._current: dict[PodKey, tuple[JudgeInputs, Judgement]] = {}
        #: Quiet pods (see the module docstring): the pod view and verdict their actions came from.
        self._was_quiet: dict[PodKey, tuple[PodView, PodVerdict]] = {}
        self._quiet: dict[PodKey, tuple[PodView, PodVerdict]] = {}
        self.hits = 0
        self.misses = 0
        self.quiet = 0  # pods whose actions were known to be nothing this cycle

    def begin(self, params: CycleParams) -> None:
        """Start a cycle; different parameters (an edited policy) invalidate every judgement."""
        if params != self._params:
            self._previous = {}
            self._was_quiet = {}
            self._params = params
        self._current = {}
        self._quiet = {}
        self.hits = self.misses = self.quiet = 0

    def get(self, key: PodKey, inputs: JudgeInputs) -> Judgement | None:
        entry = self._previous.get(key)
        if entry is None or entry[0] != inputs:
            self.misses += 1
            return None
        self._current[key] = entry
        self.hits += 1
        return entry[1]

    def put(self, key: PodKey, inputs: JudgeInputs, judgement: Judgement) -> None:
        self._current[key] = (inputs, judgement)

    def still_quiet(self, key: PodKey, pod: PodView, verdict: PodVerdict) -> bool:
        """True when the pod was quiet last cycle with this very view and verdict (identity, not
        equality: a new view is a changed pod, a new verdict a fresh judgement), so its actions are
        nothing again."""
        entry = self._was_quiet.get(key)
        if entry is None or entry[0] is not pod or entry[1] is not verdict:
            return False
        self._quiet[key] = entry
        self.quiet += 1
        return True

    def mark_quiet(self, key: PodKey, pod: PodView, verdict: PodVerdict) -> None:
        """The pod's actions, computed this cycle, wrote nothing (the caller checks quietness)."""
        self._quiet[key] = (pod, verdict)

    def end(self) -> None:
        """The cycle's plan is complete: its judgements are the ones the next cycle may reuse."""
        self._previous, self._current = self._current, {}
        self._was_quiet, self._quiet = self._quiet, {}
