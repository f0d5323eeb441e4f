"""One evaluation cycle of one policy: observe → plan → apply → settle → deliver.

The engine decides at three points (``engine/__init__.py``): what to read, the plan, and what the
outcomes settle into; this module reads, hands the plan to the Applier and delivers the settlement
(events, notifications, the status write, the gauges). Kept free of Kopf so the CLI's
``report``/``explain`` and the benchmarks drive the same code.

The observe step is ``runtime/observe.py``; the statuses this replica keeps, so the eviction
budget survives failed writes and leader changes, are ``runtime/status_book.py``; the gauges go out
through ``runtime/publish.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pydantic import ValidationError

from gpu_efficiency import engine, metrics
from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.notify.delivery import Notifier
from gpu_efficiency.actuators.status import StatusWriter
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.model import Plan, ReclaimOwner, SeniorPolicy, Snapshot
from gpu_efficiency.engine.outcomes import Outcome
from gpu_efficiency.runtime.observe import Observer, SourceFor
from gpu_efficiency.runtime.publish import publish
from gpu_efficiency.runtime.status_book import StatusBook
from gpu_efficiency.selfservice.rules import keep_choices
from gpu_efficiency.sources.kube.cluster import ClusterSource
from gpu_efficiency.sources.kube.dra import DraSource
from gpu_efficiency.sources.kube.owners import OwnerSource, OwnerState

log = logging.getLogger(__name__)


class Leader(Protocol):
    #: Terms won so far: a new value is a new term, which starts by re-reading the server's status.
    transitions: int

    def is_leader(self) -> bool: ...
    def still_leader(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def format_validation_error(exc: ValidationError) -> str:
    """One readable line per problem, with the field path in wire (camelCase) names."""
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"spec.{path}: {err['msg']}" if path else err["msg"])
    return "; ".join(parts)


@dataclass
class CycleReport:
    policy: str
    ran: bool
    reason: str = ""
    plan: Plan | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    status: GPUEfficiencyPolicyStatus | None = None
    seconds: float = 0.0
    queries: int = 0
    api_reads: int = 0
    writes: int = 0


@dataclass
class CycleRunner(Observer):
    """Everything a cycle needs, built once at start-up (the handlers' typed memo)."""

    config: OperatorConfig
    reader: ClusterSource
    applier: Applier
    status_writer: StatusWriter
    source_for: SourceFor
    leader: Leader
    clock: Callable[[], float] = time.time
    owners: OwnerSource | None = None  # owner-aware reclamation (None: pods judged one by one)
    dra: DraSource | None = None  # DRA GPUs and our DeviceTaintRules (None: node taints only)
    read_owners_always: bool = False  # report/explain: owners even before any idle clock runs
    _owner_cache: tuple[float, OwnerState] | None = None  # (when, what) of the last owner read
    notifier: Notifier | None = None  # spec.notify's webhooks (None: one-shot commands post nothing)
    _memory: dict[str, engine.Memory] = field(default_factory=dict)  # per policy: verdicts and clocks
    links: Callable[[Plan, Snapshot], Plan] | None = None  # self-service links into warnings

    def __post_init__(self) -> None:
        self._book = StatusBook(self.status_writer, lambda: self.clock())

    def forget(self, name: str) -> None:
        """The policy was deleted: drop what this runner and the metrics hold for it."""
        self._book.forget(name)
        self._memory.pop(name, None)
        self.source_for.forget(name)
        if self.notifier is not None:
            self.notifier.forget(name)
        metrics.forget_policy(name)

    def write_status(self, name: str, status: GPUEfficiencyPolicyStatus) -> GPUEfficiencyPolicyStatus:
        """Keep the status and, while leading, write it (``StatusBook.write``)."""
        self._book.keep(name, status)
        if not self.leader.still_leader():
            return status
        status, wrote = self._book.write(name, status)
        self.applier.writes += 1 if wrote else 0
        return status

    def run(
        self,
        *,
        name: str,
        uid: str,
        generation: int,
        spec_raw: Mapping[str, Any],
        status_raw: Mapping[str, Any],
        seniors: tuple[SeniorPolicy, ...] = (),
    ) -> CycleReport:
        started = time.monotonic()
        leading = self.leader.is_leader()
        if leading and not self._book.start_term(name, self.leader.transitions):
            return CycleReport(policy=name, ran=False, reason="the policy's status could not be read")
        previous = self._book.previous(name, status_raw)
        try:
            spec = GPUEfficiencyPolicySpec.model_validate(dict(spec_raw))
        except ValidationError as exc:
            message = format_validation_error(exc)
            return self._invalid(
                name, uid=uid, generation=generation, previous=previous, message=message, started=started
            )
        if not leading:
            if name in self._memory:
                self._memory[name].forget_clocks()  # another replica may reset clocks meanwhile
            return CycleReport(policy=name, ran=False, reason="not the leader")
        report = self._evaluate(
            name, spec, uid=uid, generation=generation, previous=previous, seniors=seniors
        )
        report.seconds = time.monotonic() - started
        metrics.CYCLE_SECONDS.labels(name).observe(report.seconds)
        return report

    def _invalid(
        self,
        name: str,
        *,
        uid: str,
        generation: int,
        previous: GPUEfficiencyPolicyStatus,
        message: str,
        started: float,
    ) -> CycleReport:
        """Report an invalid spec in status and (once) an event; change nothing else."""
        settled = engine.settle_invalid(previous, message=message, now=self.clock(), generation=generation)
        if settled.events and self.leader.is_leader():
            self.applier.apply(list(settled.events), policy_name=name, policy_uid=uid)
        status = self.write_status(name, settled.status)
        metrics.CYCLES.labels(name, "invalid").inc()
        metrics.forget_policy_gauges(name)  # it judges nothing until fixed: no stale verdicts or alerts
        return CycleReport(
            policy=name,
            ran=False,
            reason=f"invalid: {message}",
            status=status,
            seconds=time.monotonic() - started,
        )

    def _evaluate(
        self,
        name: str,
        spec: GPUEfficiencyPolicySpec,
        *,
        uid: str,
        generation: int,
        previous: GPUEfficiencyPolicyStatus,
        seniors: tuple[SeniorPolicy, ...],
    ) -> CycleReport:
        memory = self._memory.setdefault(name, engine.Memory())
        with gc_paused():  # ~10^5 acyclic objects: the collector would rescan them for nothing
            # observe
            snapshot, cluster, fetched = self.observe(name, generation, spec, previous, seniors)
            owner_reads = [0]

            def with_owners() -> Snapshot | None:
                richer, owner_reads[0] = self.with_owners(snapshot, cluster)
                return richer

            # plan
            snapshot, plan = engine.plan(
                snapshot, memory, with_owners=with_owners if self.owners is not None else None
            )
            cluster = replace(cluster, requests=cluster.requests + owner_reads[0])
            known = self._book.last(name) or previous
            log_generations(name, known.exporter_generations, plan.status.exporter_generations)
            if self.links is not None:
                plan = self.links(plan, snapshot)
        memo = memory.memo
        log.debug(
            "policy %s: %d verdicts kept from the previous cycle, %d judged; %d quiet pods not acted on again",
            name,
            memo.hits,
            memo.misses,
            memo.quiet,
        )
        # apply
        writes_before = self.applier.writes
        outcomes = self.applier.apply(plan.actions, policy_name=name, policy_uid=uid)
        if any(isinstance(o.action, ReclaimOwner) for o in outcomes):
            # The last read shows the owners as they were before this write: the next cycle would
            # take an owner just suspended for one restored and end its record (restore's proof).
            self._owner_cache = None
        # settle, around the notification hand-off
        try:
            settled = engine.settle(snapshot, plan, outcomes, notify=self.notifier is not None)
        except Exception:
            if self.notifier is None:
                raise
            # Notifications are a side channel: a bug drafting them never fails a cycle whose
            # writes are done (their outcomes must still be counted in the status).
            log.exception("policy %s: the notifications could not be drafted; settled without them", name)
            settled = engine.settle(snapshot, plan, outcomes, notify=False)
        unreadable = self.status_writer.problems.pop(name, None) or ()
        if unreadable:
            log.warning("policy %s: status fields dropped as unreadable: %s", name, "; ".join(unreadable))
        failures, misrouted = self._offer(name, spec, settled.notifications)
        settled = settled.close(
            sink_failures=failures, sinks=len(spec.notify), unreadable=unreadable, misrouted=misrouted
        )
        # deliver
        status = self._deliver(name, uid, settled)
        writes = self.applier.writes - writes_before
        queries = fetched.queries if fetched is not None else 0
        if settled.gauges is not None:
            publish(name, settled.gauges, queries=queries, writes=writes)
        if fetched is not None and fetched.then is not None:
            fetched.then()
        return CycleReport(
            policy=name,
            ran=True,
            plan=plan,
            outcomes=outcomes,
            status=status,
            queries=queries,
            api_reads=cluster.requests,
            writes=writes,
        )

    def _offer(
        self, name: str, spec: GPUEfficiencyPolicySpec, batch: Sequence[engine.Notification]
    ) -> tuple[dict[str, str] | None, dict[str, str]]:
        """Offer the cycle's notifications to the policy's sinks (never waits on them); the sinks
        failing now (None when there is no notifier or the hand-off failed: notifications are a
        side channel, they never fail a cycle) and the namespaces whose own webhook was unusable."""
        if self.notifier is None:
            return None, {}
        try:
            self.notifier.submit(
                name, spec.notify, batch, keep_choices(spec.idle.allow_keep_until, spec.idle.max_keep.seconds)
            )
            return self.notifier.failures(name, spec.notify), self.notifier.misrouted(name)
        except Exception:  # notifications are a side channel: they never fail a cycle
            log.exception("policy %s: notifications failed", name)
            return None, {}

    def _deliver(self, name: str, uid: str, settled: engine.Settlement) -> GPUEfficiencyPolicyStatus:
        """The settlement's events, then the status (kept in memory first, written while leading)."""
        if settled.events:
            self.applier.apply(list(settled.events), policy_name=name, policy_uid=uid)
        return self.write_status(name, settled.status)


def log_generations(name: str, before: Mapping[str, int], after: Mapping[str, int]) -> None:
    """Log which dcgm-exporter generations the policy's GPUs speak, once per change."""
    if dict(before) != dict(after):
        spoken = ", ".join(f"{gen} {n} GPU{'' if n == 1 else 's'}" for gen, n in after.items()) or "none"
        log.info("policy %s: dcgm-exporter generations: %s", name, spoken)
