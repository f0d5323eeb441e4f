"""Run every policy's cycle at its own interval, in precedence order, on one worker thread.

Kopf only feeds the registry (watch events: no finalizers, no annotations on policies), so a policy
can be deleted even while the operator is down, and its deletion stops its cycles at once. One
worker keeps cycles of overlapping policies from interleaving their writes.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpu_efficiency import metrics
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.model import NodeView, SeniorPolicy
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.runtime.fault_wake import FaultWake, PolicyRef

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 60.0
#: Beyond three intervals, the time a slow cycle may take before the liveness probe fails.
STALL_SLACK = 60.0


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    uid: str
    created: str  # RFC3339 creationTimestamp: older policies take precedence
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any]

    @property
    def precedence(self) -> tuple[str, str]:
        return (self.created, self.name)

    def interval(self) -> float:
        try:
            return max(1.0, parse_duration(str(self.spec.get("interval", "60s"))))
        except ValueError:
            return DEFAULT_INTERVAL

    def senior(self) -> SeniorPolicy | None:
        try:
            spec = GPUEfficiencyPolicySpec.model_validate(dict(self.spec))
        except ValidationError:
            return None  # an invalid policy acts on nothing, so it claims nothing
        return SeniorPolicy(self.name, spec.selection, spec.faults.enabled)


class PolicyRegistry:
    """The policies the watch has seen, newest version of each."""

    def __init__(self) -> None:
        self._entries: dict[str, PolicyEntry] = {}
        self._lock = threading.Lock()
        self.changed = threading.Event()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        with self._lock:
            if event_type == "DELETED" or meta.get("deletionTimestamp"):
                self._entries.pop(name, None)
            else:
                self._entries[name] = PolicyEntry(
                    name=name,
                    uid=meta.get("uid", ""),
                    created=meta.get("creationTimestamp", ""),
                    generation=int(meta.get("generation") or 0),
                    spec=copy.deepcopy(dict(body.get("spec") or {})),
                    status=copy.deepcopy(dict(body.get("status") or {})),
                )
        self.changed.set()

    def entries(self) -> list[PolicyEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.precedence)


def next_start(started: float, ended: float, interval: float) -> float:
    """When a cycle that ran from ``started`` to ``ended`` should run next: on its fixed grid.

    Pacing from the cycle's start keeps the period equal to the interval, so a fault sampled just
    after a cycle began waits at most one interval for the next (pacing from the end added the
    cycle's own length to every period). A cycle longer than the interval skips the slots it
    overran rather than running back to back.
    """
    due = started + interval
    if due <= ended:
        due += math.ceil((ended - due) / interval + 1e-9) * interval
    return due


class Scheduler:
    def __init__(
        self,
        runner: CycleRunner,
        registry: PolicyRegistry,
        tick: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        wake: FaultWake | None = None,
    ) -> None:
        self.runner, self.registry, self.tick, self.clock = runner, registry, tick, clock
        self.wake = wake  # early fault cycles on a node agent's report (runtime/fault_wake.py)
        self._due: dict[str, float] = {}
        self._generation: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False
        self.last_pass = clock()  # when run_due last returned: the liveness probe reads its age

    def stalled(self, slack: float = STALL_SLACK) -> str | None:
        """Why the scheduler is stuck, or None: no pass over the policies has completed within three
        of the longest interval plus ``slack`` (a hung call, or the thread gone). A pass runs every
        ``tick`` and returns once the due cycles are done, so its age is the running cycle's age."""
        longest = max((e.interval() for e in self.registry.entries()), default=DEFAULT_INTERVAL)
        limit = 3 * longest + slack
        age = self.clock() - self.last_pass
        if age <= limit:
            return None
        return f"no policy cycle completed for {age:.0f}s (limit {limit:.0f}s: 3 x {longest:g}s + {slack:g}s)"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="policy-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.registry.changed.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_due()
            self.registry.changed.wait(self.tick)
            self.registry.changed.clear()

    def node_changed(self, before: NodeView | None, after: NodeView | None) -> None:
        """The node watch's hook: a node agent's fault report wakes the policies covering the node."""
        if self.wake is None:
            return
        if self.wake.node_changed(before, after, self._policy_refs()):
            self.registry.changed.set()

    def _policy_refs(self) -> Iterator[PolicyRef]:
        """The policies, read only when iterated: most node events are no fault news, and the watch
        thread should not sort the registry under its lock for each of them."""
        for entry in self.registry.entries():
            yield PolicyRef(entry.name, entry.spec)

    def run_due(self) -> list[str]:
        """Run the cycles that are due (a new or edited policy, or one woken early, at once)."""
        self.export_leadership()
        now = self.clock()
        entries = self.registry.entries()
        early = self.wake.take_due() if self.wake is not None else set()
        live = {e.name for e in entries}
        for gone in set(self._due) - live:
            self._due.pop(gone, None)
            self._generation.pop(gone, None)
            if self.wake is not None:
                self.wake.forget(gone)
            self.runner.forget(gone)
            with contextlib.suppress(KeyError):
                metrics.LAST_CYCLE.remove(gone)
        ran = []
        seniors: list[SeniorPolicy] = []
        for entry in entries:
            edited = self._generation.get(entry.name) != entry.generation
            if edited or now >= self._due.get(entry.name, 0.0) or entry.name in early:
                if entry.name in early:
                    metrics.FAULT_WAKES.labels(entry.name, "ran").inc()
                started = self.clock()
                self._run(entry, tuple(seniors))
                ran.append(entry.name)
                self._generation[entry.name] = entry.generation
                self._due[entry.name] = next_start(started, self.clock(), entry.interval())
            senior = entry.senior()
            if senior is not None:
                seniors.append(senior)
        metrics.POLICIES.set(len(entries))
        self.last_pass = self.clock()
        return ran

    def export_leadership(self) -> None:
        """``gpu_efficiency_leader`` on every replica; a replica that lost the lease drops the
        per-policy gauges it exported, so only the leader's view is current (and alerted on)."""
        leading = self.runner.leader.is_leader()
        metrics.LEADER.set(1 if leading else 0)
        if self._leading and not leading:
            metrics.clear_policy_gauges()
        self._leading = leading

    def _run(self, entry: PolicyEntry, seniors: tuple[SeniorPolicy, ...]) -> None:
        # The cycle's snapshot and plan (~10^5 objects at 8,000 GPUs) are freed with its report
        # before the collector is re-enabled, so it never scans them (~0.1 s a cycle at that size).
        with gc_paused():
            self._run_and_log(entry, seniors)

    def _run_and_log(self, entry: PolicyEntry, seniors: tuple[SeniorPolicy, ...]) -> None:
        try:
            report = self.runner.run(
                name=entry.name,
                uid=entry.uid,
                generation=entry.generation,
                spec_raw=entry.spec,
                status_raw=entry.status,
                seniors=seniors,
            )
        except Exception:
            metrics.CYCLES.labels(entry.name, "error").inc()
            log.exception("policy %s: cycle failed; retrying next interval", entry.name)
            return
        if report.ran or report.status is not None:
            metrics.LAST_CYCLE.labels(entry.name).set(time.time())
        if report.ran:
            log.info(
                "policy %s: cycle %.2fs, %d verdicts, %d actions, %d writes, %d queries, %d API reads",
                entry.name,
                report.seconds,
                len(report.plan.verdicts) if report.plan else 0,
                len(report.plan.actions) if report.plan else 0,
                report.writes,
                report.queries,
                report.api_reads,
            )
