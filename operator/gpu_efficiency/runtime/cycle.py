"""One evaluation cycle of one policy: parse → observe → plan → act → status.

Kept free of Kopf so the CLI's ``report``/``explain`` and the benchmarks drive the same code.

The eviction budget (``recentEvictions``) is never lost to a failing write or a leader change: a
cycle's status is kept in memory before it is written (a failed write is retried next cycle), each
leadership term starts by re-reading the policy's status from the server and merging it with what
this replica holds, and a write that meets a newer status (409) re-reads and merges before its one
retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_efficiency import metrics
from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.notify.delivery import Notifier
from gpu_efficiency.actuators.outcomes import Outcome, Result
from gpu_efficiency.actuators.status import StatusWriter, read_status
from gpu_efficiency.api import names
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.policy import DeviceTaintEffect, GPUEfficiencyPolicySpec, ReclaimAction
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.engine.conditions import find_condition, set_condition
from gpu_efficiency.engine.model import (
    Action,
    AnnotateNode,
    AnnotatePod,
    DrainPod,
    EvictPod,
    Plan,
    PolicyEvent,
    ReclaimOwner,
    SeniorPolicy,
    SetNodeCondition,
    Snapshot,
    TaintNode,
    UntaintNode,
    Window,
)
from gpu_efficiency.engine.notify.messages import notifications, notifications_condition, pending_evictions
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.quarantine.dra import with_dra_capacity
from gpu_efficiency.engine.quarantine.xid_repeats import FLOOD_WINDOW_S
from gpu_efficiency.engine.reclaim.budgets import merge_budgets
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger
from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo
from gpu_efficiency.engine.reclaim.ownerreads import OwnerRead, owner_read_needed, starts_idle_clock
from gpu_efficiency.engine.reclaim.reclaimproof import accepted, newly_running
from gpu_efficiency.engine.selection import build_scope
from gpu_efficiency.engine.trust import DropReason
from gpu_efficiency.sources.kube.cluster import ClusterSource, ClusterState
from gpu_efficiency.sources.kube.dra import DraSource, DraState
from gpu_efficiency.sources.kube.owners import OwnerReader, OwnerState, OwnersUnavailable
from gpu_efficiency.sources.metrics.base import (
    ActivityHints,
    FaultHints,
    FetchRequest,
    FetchResult,
    SampleSource,
    SourceUnavailable,
)
from gpu_efficiency.sources.metrics.targets import address_book

#: Why samples are dropped as untrustworthy (gpu_efficiency_dropped_samples_total's reason label).
DROP_REASONS: tuple[str, ...] = (
    DropReason.INVALID_ID,
    DropReason.NODE_CONFLICT,
    DropReason.POD_NODE_MISMATCH,
    DropReason.GPUS_EXCEED_CAPACITY,
    DropReason.CONTRADICTS_AGENT,
)
#: The owner actions counted in gpu_efficiency_reclaims_total (Evict is counted as evictions).
RECLAIM_ACTIONS = (
    ReclaimAction.SCALE_TO_ZERO,
    ReclaimAction.STOP,
    ReclaimAction.SUSPEND,
    ReclaimAction.DEACTIVATE,
)
#: How old the last owner read may be when no pod is warned or due this cycle (it then only shapes
#: annotation texts; every warning and every action reads the owners afresh).
OWNER_CACHE_SECONDS = 300.0

log = logging.getLogger(__name__)


class Leader(Protocol):
    #: Terms won so far: a new value is a new term, which starts by re-reading the server's status.
    transitions: int

    def is_leader(self) -> bool: ...
    def still_leader(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


class SourceFor(Protocol):
    """The metrics source of a policy's spec; ``forget`` a deleted policy (its sources may go)."""

    def __call__(self, policy: str, spec: GPUEfficiencyPolicySpec) -> SampleSource: ...
    def forget(self, policy: str) -> None: ...


def windows_for(spec: GPUEfficiencyPolicySpec) -> dict[Window, float]:
    """The aggregation windows a policy needs, in seconds."""
    windows = {Window.ACTIVITY: parse_duration(spec.window)}
    if spec.faults.enabled:
        windows[Window.FAULT] = parse_duration(spec.faults.lookback)
        if spec.faults.thermal.enabled:
            windows[Window.THERMAL_HOLD] = parse_duration(spec.faults.thermal.for_duration)
            windows[Window.THERMAL_RECOVERY] = parse_duration(spec.faults.thermal.recovery_after)
    return windows


def fault_hints(spec: GPUEfficiencyPolicySpec, cluster: ClusterState) -> FaultHints:
    """What the source needs to fetch fault series only for GPUs that may be faulted."""
    thermal = spec.faults.thermal
    hot = spec.faults.enabled and thermal.enabled
    xid_windows: tuple[float, ...] = ()
    if spec.faults.enabled and spec.faults.xid.enabled:
        lookback = parse_duration(spec.faults.lookback)
        xid_windows = (lookback, FLOOD_WINDOW_S, *(parse_duration(r.within) for r in spec.faults.xid.repeat))
    return FaultHints(
        gpu_temperature_above=thermal.gpu_temperature_above if hot else None,
        memory_temperature_above=thermal.memory_temperature_above if hot else None,
        held_nodes=frozenset(n.name for n in cluster.nodes if names.NODE_FAULTS in n.annotations),
        xid_windows=xid_windows,
    )


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
class CycleRunner:
    """Everything a cycle needs, built once at start-up (the handlers' typed memo)."""

    config: OperatorConfig
    reader: ClusterSource
    applier: Applier
    status_writer: StatusWriter
    source_for: SourceFor
    leader: Leader
    clock: Callable[[], float] = time.time
    owners: OwnerReader | None = None  # owner-aware reclamation (None: pods judged one by one)
    dra: DraSource | None = None  # DRA GPUs and our DeviceTaintRules (None: node taints only)
    read_owners_always: bool = False  # report/explain: owners even before any idle clock runs
    _owner_cache: tuple[float, OwnerState] | None = None  # (when, what) of the last owner read
    notifier: Notifier | None = None  # spec.notify's webhooks (None: one-shot commands post nothing)
    _last_status: dict[str, GPUEfficiencyPolicyStatus] = field(default_factory=dict)
    _memos: dict[str, JudgeMemo] = field(default_factory=dict)  # per policy: last cycle's verdicts
    _terms: dict[str, int] = field(default_factory=dict)  # per policy: the term its status was read in
    _ledgers: dict[str, IdleLedger] = field(default_factory=dict)  # per policy: idle clocks we wrote

    def previous_status(self, name: str, status_raw: Mapping[str, Any]) -> GPUEfficiencyPolicyStatus:
        if name in self._last_status:
            return self._last_status[name]
        previous, problems = read_status(status_raw)
        if problems:
            self.status_writer.problems[name] = problems
        self.status_writer.seed(name, previous.model_dump(by_alias=True, mode="json"))
        return previous

    def forget(self, name: str) -> None:
        """The policy was deleted: drop what this runner and the metrics hold for it."""
        self._last_status.pop(name, None)
        self._memos.pop(name, None)
        self._terms.pop(name, None)
        self._ledgers.pop(name, None)
        self.status_writer.forget(name)
        self.source_for.forget(name)
        if self.notifier is not None:
            self.notifier.forget(name)
        metrics.forget_policy(name)

    def start_term(self, name: str) -> bool:
        """At the first cycle of a leadership term: the server's status, with this replica's own
        budget record merged in (evictions it counted but could not write). False: not read."""
        if self._terms.get(name) == self.leader.transitions:
            return True
        try:
            server = self.status_writer.read(name)
        except Exception as exc:
            log.warning("policy %s: could not read its status at the start of the term: %s", name, exc)
            return False
        if server is None:
            return False  # the policy is gone; its deletion reaches the scheduler next
        local = self._last_status.get(name)
        self._last_status[name] = server if local is None else merge_budgets(server, local, self.clock())
        self._terms[name] = self.leader.transitions
        return True

    def write_status(self, name: str, status: GPUEfficiencyPolicyStatus) -> GPUEfficiencyPolicyStatus:
        """Write the status; it is kept in memory first, so a failed write is retried next cycle
        with nothing lost. A conflict (another writer since our last read) is merged and retried once."""
        self._last_status[name] = status
        metrics.STATUS_WRITES_FAILED.labels(name)  # exported at 0 from the first cycle, so rate() works
        try:
            try:
                wrote = self.status_writer.write(name, status)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                server = self.status_writer.read(name)
                if server is None:
                    return status
                status = self._last_status[name] = merge_budgets(status, server, self.clock())
                wrote = self.status_writer.write(name, status)
        except Exception as exc:
            metrics.STATUS_WRITES_FAILED.labels(name).inc()
            log.warning("policy %s: status write failed, kept and retried next cycle: %s", name, exc)
            return status
        if wrote:
            self.applier.writes += 1
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
        if leading and not self.start_term(name):
            return CycleReport(policy=name, ran=False, reason="the policy's status could not be read")
        previous = self.previous_status(name, status_raw)
        try:
            spec = GPUEfficiencyPolicySpec.model_validate(dict(spec_raw))
        except ValidationError as exc:
            return self._invalid(name, uid, generation, previous, format_validation_error(exc), started)
        if not leading:
            self._ledgers.pop(name, None)  # another replica may reset clocks meanwhile
            return CycleReport(policy=name, ran=False, reason="not the leader")
        report = self._evaluate(name, uid, generation, spec, previous, seniors)
        report.seconds = time.monotonic() - started
        metrics.CYCLE_SECONDS.labels(name).observe(report.seconds)
        return report

    def _invalid(
        self,
        name: str,
        uid: str,
        generation: int,
        previous: GPUEfficiencyPolicyStatus,
        message: str,
        started: float,
    ) -> CycleReport:
        """Report an invalid spec in status and (once) an event; change nothing else."""
        now = self.clock()
        was_invalid = any(
            c.type == names.COND_VALID and c.status == "False" and c.message == message
            for c in previous.conditions
        )
        conditions = set_condition(
            previous.conditions,
            type=names.COND_VALID,
            status="False",
            reason="InvalidSpec",
            message=message,
            now=now,
            generation=generation,
        )
        conditions = set_condition(
            conditions,
            type=names.COND_READY,
            status="False",
            reason="InvalidSpec",
            message="the policy spec is invalid",
            now=now,
            generation=generation,
        )
        status = previous.model_copy(update={"conditions": conditions, "observed_generation": generation})
        if not was_invalid and self.leader.is_leader():
            self.applier.apply(
                [PolicyEvent(reason=names.EV_POLICY_INVALID, message=message, type="Warning")],
                policy_name=name,
                policy_uid=uid,
            )
        if self.leader.still_leader():
            status = self.write_status(name, status)
        self._last_status[name] = status
        metrics.CYCLES.labels(name, "invalid").inc()
        metrics.forget_policy_gauges(name)  # it judges nothing until fixed: no stale verdicts or alerts
        return CycleReport(
            policy=name,
            ran=False,
            reason=f"invalid: {message}",
            status=status,
            seconds=time.monotonic() - started,
        )

    def observe(
        self,
        name: str,
        generation: int,
        spec: GPUEfficiencyPolicySpec,
        previous: GPUEfficiencyPolicyStatus,
        seniors: tuple[SeniorPolicy, ...] = (),
    ) -> tuple[Snapshot, ClusterState, FetchResult | None]:
        """Read the cluster and metrics into a snapshot (no writes): shared with report/explain.
        Also returns the fetch's result (None when the source was unavailable), whose deferred work
        (``FetchResult.then``) a cycle starts once it has made its writes.

        Nodes first (the fetch's fault hints need them), then the pods are listed while the metrics
        are fetched: at thousands of pods both take seconds, mostly waiting on the servers.
        """
        now = self.clock()
        nodes = self.reader.read_nodes()
        request = FetchRequest(
            now=now,
            windows=windows_for(spec),
            scrape_interval=parse_duration(spec.metrics.prometheus.scrape_interval),
            hints=fault_hints(spec, nodes),
            activity=ActivityHints(idle_below=spec.idle.activity_below),
            targets=address_book(nodes.nodes, nodes.pod_addresses),
        )
        available, error = True, ""
        result: FetchResult | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fetch") as pool:
            fetching = pool.submit(self.source_for(name, spec).fetch, request)
            cluster = self.reader.read_pods(nodes)
            try:
                result = fetching.result()
            except SourceUnavailable as exc:
                available, error = False, str(exc)
            except Exception as exc:  # a source's bug or an answer it failed to decode: blind, not idle
                log.exception("policy %s: the metric source failed", name)
                available, error = False, f"metric source failed: {type(exc).__name__}: {exc}"
        owners, owners_error = self._read_owners(cluster, spec)
        dra_reads = self.dra.requests if self.dra is not None else 0
        dra = self.dra.read() if self.dra is not None and spec.faults.enabled else DraState()
        if self.dra is not None and spec.faults.device_quarantine.effect is DeviceTaintEffect.NO_EXECUTE:
            dra = self.dra.with_claims(dra)  # who holds a faulty device: only a drain needs it
        dra_reads = (self.dra.requests if self.dra is not None else 0) - dra_reads
        if dra.blind and available:  # a missing rule would read as an admin's removal
            available, error = False, dra.error
        gpus = result.gpus if result is not None else ()
        if available and not gpus and cluster.pods:
            available, error = False, no_series_message(self.config.prometheus_matchers)
        snapshot = Snapshot(
            now=now,
            policy_name=name,
            policy=spec,
            status=previous,
            generation=generation,
            gpus=gpus,
            pods=cluster.pods,
            nodes=with_dra_capacity(cluster.nodes, dra.devices),
            namespaces=cluster.namespaces,
            metrics_available=available,
            metrics_error=error,
            protected_namespaces=self.config.all_protected_namespaces
            | frozenset(spec.selection.excluded_namespaces),
            senior_policies=seniors,
            dropped_samples=result.dropped if result is not None else {},
            **_owner_fields(owners, owners_error),
            pending=cluster.pending,
            dra_devices=dra.devices,
            device_rules=dra.rules,
            device_uses=dra.uses,
        )
        if owners is not None:
            cluster = replace(cluster, requests=cluster.requests + owners.requests)
        if dra_reads:  # the DRA LISTs count as the cycle's API reads too
            cluster = replace(cluster, requests=cluster.requests + dra_reads)
        return snapshot, cluster, result

    def _read_owners(
        self, cluster: ClusterState, spec: GPUEfficiencyPolicySpec, *, at_least: OwnerRead = OwnerRead.NONE
    ) -> tuple[OwnerState | None, str]:
        """The pods' owners when this cycle needs them (``pods/ownerreads.py``): read afresh when an
        in-scope pod is warned or due, else the last read (at most ``OWNER_CACHE_SECONDS`` old), else
        none. report/explain (``read_owners_always``) and straggler events read them every time;
        ``at_least``: what the caller knows it needs whatever the pods' clocks say."""
        if self.owners is None:
            return None, ""
        if self.read_owners_always:
            need = OwnerRead.FRESH
        elif at_least is not OwnerRead.NONE:
            need = at_least
        else:
            scope = build_scope(
                spec.selection, self.config.all_protected_namespaces, cluster.namespaces, cluster.nodes
            )
            need = owner_read_needed(cluster.pods, scope, self.clock(), parse_duration(spec.idle.idle_for))
            if spec.stragglers.enabled and need is OwnerRead.NONE:
                need = OwnerRead.CACHED  # straggler events go to the job's top owner
        if need is OwnerRead.NONE:
            return None, ""
        cached = self._owner_cache
        if (
            need is OwnerRead.CACHED
            and cached is not None
            and self.clock() - cached[0] <= OWNER_CACHE_SECONDS
        ):
            return replace(cached[1], requests=0), ""
        try:
            state = self.owners.read()
        except OwnersUnavailable as exc:
            log.warning("owners not read, nothing with a controller is reclaimed this cycle: %s", exc)
            return None, str(exc)
        self._owner_cache = (self.clock(), state)
        return state, ""

    def _evaluate(
        self,
        name: str,
        uid: str,
        generation: int,
        spec: GPUEfficiencyPolicySpec,
        previous: GPUEfficiencyPolicyStatus,
        seniors: tuple[SeniorPolicy, ...],
    ) -> CycleReport:
        with gc_paused():  # ~10^5 acyclic objects: the collector would rescan them for nothing
            snapshot, cluster, fetched = self.observe(name, generation, spec, previous, seniors)
            memo = self._memos.setdefault(name, JudgeMemo())
            ledger = self._ledgers.setdefault(name, IdleLedger())
            before = ledger.checkpoint()
            plan = plan_cycle(snapshot, memo, ledger)
            known = self._last_status.get(name, previous)
            log_generations(name, known.exporter_generations, plan.status.exporter_generations)
            if (
                snapshot.owners is None
                and self.owners is not None
                and starts_idle_clock(snapshot.pods, plan.verdicts)
            ):
                # A pod turns idle while no clock ran, so the owners were not read: its first idle
                # annotation would carry the owner-blind recommendation and the next cycle, with the
                # owners read, would rewrite it (a second patch and a ReclaimSkipped event per pod).
                # Judge once more with the owners instead (the judgements come from the memo).
                owners, owners_error = self._read_owners(cluster, spec, at_least=OwnerRead.CACHED)
                if owners is not None or owners_error:
                    snapshot = replace(snapshot, **_owner_fields(owners, owners_error))
                    if owners is not None:
                        cluster = replace(cluster, requests=cluster.requests + owners.requests)
                    ledger.restore(before)
                    plan = plan_cycle(snapshot, memo, ledger)
        log.debug(
            "policy %s: %d verdicts kept from the previous cycle, %d judged", name, memo.hits, memo.misses
        )
        queries = fetched.queries if fetched is not None else 0
        writes_before = self.applier.writes
        outcomes = self.applier.apply(plan.actions, policy_name=name, policy_uid=uid)
        if any(isinstance(o.action, ReclaimOwner) for o in outcomes):
            # The last read shows the owners as they were before this write: the next cycle would
            # take an owner just suspended for one restored and end its record (restore's proof).
            self._owner_cache = None
        status = fold_outcomes(plan.status, outcomes, snapshot.now, plan.reclamations)
        status = self._notify(name, uid, spec, snapshot, plan, outcomes, status)
        status = self._report_unreadable_status(name, uid, status, snapshot.now, generation)
        if self.leader.still_leader():
            status = self.write_status(name, status)
        self._last_status[name] = status
        writes = self.applier.writes - writes_before
        _record_metrics(name, snapshot, plan, outcomes, status, queries, writes)
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

    def _report_unreadable_status(
        self, name: str, uid: str, status: GPUEfficiencyPolicyStatus, now: float, generation: int
    ) -> GPUEfficiencyPolicyStatus:
        """StatusValid: False (and a StatusFieldInvalid event) in the cycle after a read of the
        status from the server dropped unreadable fields; the other fields were kept and this cycle
        rewrites the status without them, so the next cycle sets it True again."""
        problems = self.status_writer.problems.pop(name, None)
        if not problems:
            previous = find_condition(status.conditions, names.COND_STATUS_VALID)
            if previous is None or previous.status == "True":
                return status
            conditions = set_condition(
                status.conditions, type=names.COND_STATUS_VALID, status="True", reason="Readable",
                message="every status field was readable", now=now, generation=generation,
            )  # fmt: skip
            return status.model_copy(update={"conditions": conditions})
        message = (
            f"dropped as unreadable, every other status field kept (recentEvictions, reclamations): "
            f"{'; '.join(problems)}"
        )[:1024]
        log.warning("policy %s: %s", name, message)
        event = PolicyEvent(reason=names.EV_STATUS_FIELD_INVALID, message=message, type="Warning")
        self.applier.apply([event], policy_name=name, policy_uid=uid)
        conditions = set_condition(
            status.conditions, type=names.COND_STATUS_VALID, status="False", reason="FieldsUnreadable",
            message=message, now=now, generation=generation,
        )  # fmt: skip
        return status.model_copy(update={"conditions": conditions})

    def _notify(
        self,
        name: str,
        uid: str,
        spec: GPUEfficiencyPolicySpec,
        snapshot: Snapshot,
        plan: Plan,
        outcomes: list[Outcome],
        status: GPUEfficiencyPolicyStatus,
    ) -> GPUEfficiencyPolicyStatus:
        """Offer what this cycle did to the policy's sinks (never waits on them) and report their
        health in the NotificationsHealthy condition (a NotificationFailed event when it turns False)."""
        if self.notifier is None:
            return status
        try:
            warned_before = {p.uid for p in snapshot.pods if names.EVICTION_BLOCKED in p.annotations}
            done = [o.action for o in outcomes if o.result is Result.DONE]
            refused = [
                o.action
                for o in outcomes
                if isinstance(o.action, EvictPod)
                and o.result is Result.BLOCKED
                and o.action.uid not in warned_before
            ]
            batch = (
                notifications(
                    done, refused, snapshot, plan,
                    window_s=parse_duration(spec.window),
                    max_keep_s=parse_duration(spec.idle.max_keep),
                    keep_allowed=spec.idle.allow_keep_until,
                )
                if spec.notify
                else []
            )  # fmt: skip
            self.notifier.submit(name, spec.notify, batch)
            conditions, event = notifications_condition(
                status.conditions,
                self.notifier.failures(name, spec.notify),
                len(spec.notify),
                snapshot.now,
                snapshot.generation,
            )
        except Exception:  # notifications are a side channel: they never fail a cycle
            log.exception("policy %s: notifications failed", name)
            return status
        if event is not None:
            self.applier.apply([event], policy_name=name, policy_uid=uid)
        return status.model_copy(update={"conditions": conditions})


_NODE_WRITES = (TaintNode, UntaintNode, SetNodeCondition, AnnotateNode)


def no_series_message(matchers: str) -> str:
    """What a cycle that found no GPU series says: the matcher it used and how to check it."""
    used = f"matcher {matchers}" if matchers else "no matcher (any job)"
    return (
        f"no dcgm-exporter series found with the {used}: is dcgm-exporter (or the node agent) scraped, "
        'and under which job? Check with count by (job) ({__name__=~"DCGM_FI_DEV_(GPU_UTIL|FB_USED).*"}) '
        "and set --prometheus-matchers to match"
    )


def log_generations(name: str, before: Mapping[str, int], after: Mapping[str, int]) -> None:
    """Log which dcgm-exporter generations the policy's GPUs speak, once per change."""
    if dict(before) != dict(after):
        spoken = ", ".join(f"{gen} {n} GPU{'' if n == 1 else 's'}" for gen, n in after.items()) or "none"
        log.info("policy %s: dcgm-exporter generations: %s", name, spoken)


def feed_write(reader: ClusterSource, outcome: Outcome) -> None:
    """Hand the reader what a write returned (read-your-writes for the watch cache; the applier's
    ``on_written``), so the next cycle never re-plans a write, or an eviction, whose watch event
    has not arrived yet."""
    if outcome.obj is not None:
        if isinstance(outcome.action, (AnnotatePod, EvictPod)):
            reader.pod_written(outcome.obj)
        elif isinstance(outcome.action, _NODE_WRITES):
            reader.node_written(outcome.obj)
    if isinstance(outcome.action, (EvictPod, DrainPod)) and outcome.result is Result.DONE:
        reader.pod_evicted(outcome.action.uid)


def fold_outcomes(
    status: GPUEfficiencyPolicyStatus,
    outcomes: list[Outcome],
    now: float,
    drafts: Sequence[tuple[tuple[Action, ...], Reclamation]] = (),
) -> GPUEfficiencyPolicyStatus:
    """Count what actually happened (the plan only says what was attempted); ``drafts``: the
    plan's reclamation records, kept for the reclamations one of whose actions was accepted."""
    # An outcome the API left unknown (5xx or timeout after sending, re-read inconclusive) counts as
    # done for the hour's budget and keeps its reclamation record (restore needs it).
    evicted = [o for o in outcomes if isinstance(o.action, EvictPod) and o.result.counts]
    blocked = [o for o in outcomes if isinstance(o.action, EvictPod) and o.result is Result.BLOCKED]
    reclaimed = [o for o in outcomes if isinstance(o.action, ReclaimOwner) and o.result.counts]
    if not evicted and not blocked and not reclaimed:
        return status
    done = [o.action for o in (*evicted, *reclaimed)]
    records = [record for actions, record in drafts if any(a in done for a in actions)]
    if records:
        status = status.model_copy(update={"reclamations": accepted(status.reclamations, records)})
    # each owner reclaimed counts once against the rolling hour's budget, like one eviction
    recent = [*status.recent_evictions, *(format_rfc3339(now) for _ in [*evicted, *reclaimed])]
    return status.model_copy(
        update={
            "evictions_total": status.evictions_total + len(evicted),
            "evictions_blocked_total": status.evictions_blocked_total + len(blocked),
            "reclaims_total": status.reclaims_total + len(reclaimed),
            "recent_evictions": recent,
        }
    )


def _record_metrics(
    name: str,
    snapshot: Snapshot,
    plan: Plan,
    outcomes: list[Outcome],
    status: GPUEfficiencyPolicyStatus,
    queries: int,
    writes: int,
) -> None:
    metrics.CYCLES.labels(name, "ok" if snapshot.metrics_available else "metrics_unavailable").inc()
    metrics.METRICS_AVAILABLE.labels(name).set(1 if snapshot.metrics_available else 0)
    metrics.PROM_QUERIES.labels(name).inc(queries)
    metrics.API_WRITES.labels(name).inc(writes)
    counts = status.verdicts
    for verdict, value in (
        ("Idle", counts.idle),
        ("Underutilized", counts.underutilized),
        ("Efficient", counts.efficient),
        ("Unknown", counts.unknown),
    ):
        metrics.PODS.labels(name, verdict).set(value)
    diagnoses: dict[str, int] = {}
    for v in plan.verdicts:
        diagnoses[v.diagnosis.value] = diagnoses.get(v.diagnosis.value, 0) + 1
    metrics.reset_labelled(metrics.DIAGNOSES, name, diagnoses)
    metrics.IDLE_GPUS.labels(name).set(status.idle_gpus)
    metrics.IDLE_GPU_HOURS.labels(name).inc(max(0.0, status.idle_gpu_hours - snapshot.status.idle_gpu_hours))
    for reason in DROP_REASONS:  # exported at 0 from the first cycle, so an alert's rate() sees the first
        metrics.DROPPED_SAMPLES.labels(name, reason)
    for reason, count in plan.status.dropped_samples.items():
        metrics.DROPPED_SAMPLES.labels(name, reason).inc(count)
    metrics.WASTE_PER_HOUR.labels(name).set(status.estimated_waste_per_hour)
    metrics.BREAKER_OPEN.labels(name).set(
        1 if any(c.type == names.COND_BREAKER and c.status == "True" for c in status.conditions) else 0
    )
    kinds: dict[str, int] = {"ecc": 0, "xid": 0, "thermal": 0}
    for q in status.quarantined_nodes:
        if q.tainted:
            kinds[q.kind] = kinds.get(q.kind, 0) + 1
    metrics.reset_labelled(metrics.TAINTED_NODES, name, kinds)
    metrics.reset_groups(metrics.STRAGGLER_GPUS, name, {(ns, group): n for ns, group, n in plan.stragglers})
    metrics.reset_series(metrics.POD_EVICTION_PENDING, name, pending_evictions(snapshot, plan))
    for action in RECLAIM_ACTIONS:  # exported at 0 from the first cycle, so rate() sees the first
        for result in (Result.DONE, Result.FAILED):
            metrics.RECLAIMS.labels(name, action, result.value)
    metrics.GPU_HOURS_RETURNED.labels(name).inc(
        max(0.0, status.gpu_hours_returned - snapshot.status.gpu_hours_returned)
    )
    to_running = metrics.RECLAIM_TO_RUNNING.labels(name)
    for seconds in newly_running(snapshot.status.reclamations, status.reclamations):
        to_running.observe(seconds)
    metrics.PENDING_GPU_DEMAND.labels(name).set(status.pending_gpu_demand.gpus)
    for result in (Result.DONE, Result.BLOCKED, Result.FAILED):  # at 0 from the first cycle, for rate()
        metrics.DRAIN_EVICTIONS.labels(name, result.value)
    for o in outcomes:
        if isinstance(o.action, EvictPod):
            metrics.EVICTIONS.labels(name, o.result.value).inc()
        elif isinstance(o.action, DrainPod):
            metrics.DRAIN_EVICTIONS.labels(name, o.result.value).inc()
        elif isinstance(o.action, ReclaimOwner):
            metrics.RECLAIMS.labels(name, o.action.action, o.result.value).inc()


def _owner_fields(owners: OwnerState | None, error: str) -> dict[str, Any]:
    """The snapshot's owner fields from one read (``None`` and no error: not read this cycle)."""
    return {
        "owners": owners.objects if owners is not None else ({} if error else None),
        "autoscalers": owners.autoscalers if owners is not None else {},
        "owners_error": error,
        "disruption_budgets": owners.disruption_budgets if owners is not None else (),
    }
