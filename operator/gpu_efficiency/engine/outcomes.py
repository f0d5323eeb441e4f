"""Results of applying actions: the Applier reports them, the engine settles them into status, events and gauges."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpu_efficiency.engine.model import Action


class Result(StrEnum):
    DONE = "done"  # the write happened
    NOOP = "noop"  # nothing to change (already in the desired state): no write made
    BLOCKED = "blocked"  # refused by design (eviction 429 from a PodDisruptionBudget): retry later
    SKIPPED = "skipped"  # not applied (dry run, object gone, precondition changed)
    FAILED = "failed"  # an error; message says which
    #: The API may have applied it (5xx, timeout or reset after sending) and a re-read could not
    #: tell: counted as done for every budget, its undo record and status record kept.
    UNKNOWN = "unknown"

    @property
    def counts(self) -> bool:
        """Counted against the budgets (and its reclamation recorded): done, or possibly done."""
        return self in (Result.DONE, Result.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Outcome:
    action: Action
    result: Result
    message: str = ""
    #: The object as the API server returned it after this outcome's write (pod or node JSON),
    #: fed back to the watch cache so the next cycle reads its own write.
    obj: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
