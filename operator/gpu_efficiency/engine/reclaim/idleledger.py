"""The idle clocks this operator process set or accepted, by pod uid (issue 19, finding 4).

The idle lifecycle lives in pod annotations (restart-safe, safety rule 6), but a pod's owner can
edit them: deleting ``idle-since`` restarts the clock, deleting ``keep-until-seen`` (or removing
and re-adding ``keep-until``) restarts the ``maxKeep`` bound, and ``evict-after`` can be pushed out.
The ledger keeps what the operator wrote, and the lifecycle takes the earlier of it and the
annotation, restores the annotation and says so in an event.

Memory is only trusted while this process judged the policy without a break: it is dropped when a
cycle comes more than two intervals after the last (a paused process, a lost leadership), so a
clock another replica reset meanwhile is never taken back to an older value. After a restart the
annotations alone carry the clocks, as before.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdleClock:
    """One pod's bookkeeping times as the operator wrote them (Unix seconds, whole seconds)."""

    idle_since: float | None = None
    evict_after: float | None = None
    keep_seen: float | None = None
    keep_shown: bool = True  # keep-until-seen is on the pod (False: kept after keep-until was removed)

    def __bool__(self) -> bool:
        return not (self.idle_since is None and self.evict_after is None and self.keep_seen is None)


class IdleLedger:
    """One policy's remembered clocks (the handler keeps one per policy, the planner fills it)."""

    __slots__ = ("_clocks", "_last_now")

    def __init__(self) -> None:
        self._clocks: dict[str, IdleClock] = {}
        self._last_now: float | None = None

    def begin(self, now: float, interval_s: float) -> None:
        """Start a cycle; after a break of more than two intervals (or a clock going back) forget."""
        last = self._last_now
        if last is None or now < last or now - last > 2 * interval_s:
            self._clocks = {}
        self._last_now = now

    def get(self, uid: str) -> IdleClock | None:
        return self._clocks.get(uid)

    def end(self, clocks: dict[str, IdleClock]) -> None:
        """The cycle's clocks of the pods it judged (pods that left are forgotten)."""
        self._clocks = clocks

    def checkpoint(self) -> tuple[dict[str, IdleClock], float | None]:
        """The ledger as it is, for ``restore``: a cycle that plans twice must not read its own first
        plan's clocks as remembered (a missing annotation would then look removed by the owner)."""
        return self._clocks, self._last_now

    def restore(self, checkpoint: tuple[dict[str, IdleClock], float | None]) -> None:
        self._clocks, self._last_now = checkpoint  # begin/end replace the dict, never mutate it

    def __len__(self) -> int:
        return len(self._clocks)
