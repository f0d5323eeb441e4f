"""Results of applying actions, reported back for status, events and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpu_efficiency.engine.model import Action


class Result(StrEnum):
    DONE = "done"  # the write happened
    NOOP = "noop"  # nothing to change (already in the desired state): no write made
    BLOCKED = "blocked"  # refused by design (eviction 429 from a PodDisruptionBudget): retry later
    SKIPPED = "skipped"  # not applied (dry run, object gone, precondition changed)
    FAILED = "failed"  # an error; message says which


@dataclass(frozen=True, slots=True)
class Outcome:
    action: Action
    result: Result
    message: str = ""
