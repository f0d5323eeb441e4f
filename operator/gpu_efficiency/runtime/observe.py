"""The observe step of a cycle: the cluster, the metrics, the owners and the DRA objects, read into
one snapshot (no writes), as the engine's ``reads`` answer says. Shared with report/explain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from gpu_efficiency import engine
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import SeniorPolicy, Snapshot
from gpu_efficiency.sources.kube.cluster import ClusterSource, ClusterState
from gpu_efficiency.sources.kube.dra import DraSource, DraState
from gpu_efficiency.sources.kube.owners import OwnerSource, OwnerState, OwnersUnavailable
from gpu_efficiency.sources.metrics.base import (
    ActivityHints,
    FaultHints,
    FetchRequest,
    FetchResult,
    SampleSource,
    SourceUnavailable,
    read_early,
)
from gpu_efficiency.sources.metrics.targets import address_book

#: How old the last owner read may be when no pod is warned or due this cycle (it then only shapes
#: annotation texts; every warning and every action reads the owners afresh).
OWNER_CACHE_SECONDS = 300.0

log = logging.getLogger(__name__)


class SourceFor(Protocol):
    """The metrics source of a policy's spec; ``forget`` a deleted policy (its sources may go)."""

    def __call__(self, policy: str, spec: GPUEfficiencyPolicySpec) -> SampleSource: ...
    def forget(self, policy: str) -> None: ...


class Observer:
    """What a cycle reads with (``CycleRunner`` is one): the readers, and the last owner read."""

    config: OperatorConfig
    reader: ClusterSource
    source_for: SourceFor
    clock: Callable[[], float]
    owners: OwnerSource | None
    dra: DraSource | None
    read_owners_always: bool
    _owner_cache: tuple[float, OwnerState] | None

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
        are fetched: at thousands of pods both take seconds, mostly waiting on the servers. What the
        fetch reads whatever the nodes say starts before them (``base.EarlyReads``: a restart's
        whole activity window, while the informers' first LIST runs).
        """
        now = self.clock()
        source = self.source_for(name, spec)
        early = early_request(spec, now)
        read_early(source, early)
        nodes = self.reader.read_nodes()
        reads = engine.reads(spec, nodes=nodes.nodes)
        request = replace(
            early,
            hints=FaultHints(
                gpu_temperature_above=reads.gpu_temperature_above,
                memory_temperature_above=reads.memory_temperature_above,
                held_nodes=reads.held_nodes,
                xid_windows=reads.xid_windows,
            ),
            targets=address_book(nodes.nodes, nodes.pod_addresses),
        )
        available, error = True, ""
        result: FetchResult | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fetch") as pool:
            fetching = pool.submit(source.fetch, request)
            cluster = self.reader.read_pods(nodes)
            try:
                result = fetching.result()
            except SourceUnavailable as exc:
                available, error = False, str(exc)
            except Exception as exc:  # a source's bug or an answer it failed to decode: blind, not idle
                log.exception("policy %s: the metric source failed", name)
                available, error = False, f"metric source failed: {type(exc).__name__}: {exc}"
        owners, owners_error = self._read_owners(cluster, spec, reads=reads)
        dra, dra_reads = self._read_dra(reads)
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
            nodes=engine.with_dra_capacity(cluster.nodes, dra.devices),
            namespaces=cluster.namespaces,
            metrics_available=available,
            metrics_error=error,
            protected_namespaces=self.config.all_protected_namespaces
            | frozenset(spec.selection.excluded_namespaces),
            senior_policies=seniors,
            dropped_samples=result.dropped if result is not None else {},
            **owner_fields(owners, owners_error),
            pending=cluster.pending,
            dra_devices=dra.devices,
            device_rules=dra.rules,
            device_uses=dra.uses,
        )
        owner_reads = owners.requests if owners is not None else 0
        return snapshot, replace(cluster, requests=cluster.requests + owner_reads + dra_reads), result

    def _read_dra(self, reads: engine.ReadPlan) -> tuple[DraState, int]:
        """The DRA devices and our DeviceTaintRules (and who holds each device, when the engine
        says so), with the LISTs it took: they count as the cycle's API reads too."""
        if self.dra is None:
            return DraState(), 0
        before = self.dra.requests
        dra = self.dra.read() if reads.dra else DraState()
        if reads.dra_claims:
            dra = self.dra.with_claims(dra)
        return dra, self.dra.requests - before

    def _read_owners(
        self,
        cluster: ClusterState,
        spec: GPUEfficiencyPolicySpec,
        *,
        at_least: engine.OwnerRead = engine.OwnerRead.NONE,
        reads: engine.ReadPlan | None = None,
    ) -> tuple[OwnerState | None, str]:
        """The pods' owners when this cycle needs them (the engine's ``ReadPlan.owners``): read afresh
        when an in-scope pod is warned or due, else the watched owners where a watch keeps them
        (``sources/kube/owner_cache.py``), else the last read (at most ``OWNER_CACHE_SECONDS`` old),
        else none. report/explain (``read_owners_always``) read them every time; ``at_least``:
        what the caller knows it needs whatever the pods' clocks say."""
        if self.owners is None:
            return None, ""
        need = engine.OwnerRead.FRESH if self.read_owners_always else at_least
        if need is engine.OwnerRead.NONE:
            plan = reads if reads is not None else engine.reads(spec, nodes=cluster.nodes)
            need = plan.owners(
                pods=cluster.pods,
                namespaces=cluster.namespaces,
                nodes=cluster.nodes,
                protected_namespaces=self.config.all_protected_namespaces,
                now=self.clock(),
            )
        if need is engine.OwnerRead.NONE:
            return None, ""
        cached = self._owner_cache
        if need is engine.OwnerRead.CACHED and cached is not None:  # None after a reclaim: LIST once
            watched = self.owners.current()
            if watched is not None:
                return watched, ""
            if self.clock() - cached[0] <= OWNER_CACHE_SECONDS:
                return replace(cached[1], requests=0), ""
        try:
            state = self.owners.read()
        except OwnersUnavailable as exc:
            log.warning("owners not read, nothing with a controller is reclaimed this cycle: %s", exc)
            return None, str(exc)
        self._owner_cache = (self.clock(), state)
        return state, ""

    def with_owners(self, snapshot: Snapshot, cluster: ClusterState) -> tuple[Snapshot | None, int]:
        """The snapshot with the owners read (at least the last read), and the reads it took; None
        when they were not read and no error says why (``engine.plan`` asks for it)."""
        owners, error = self._read_owners(cluster, snapshot.policy, at_least=engine.OwnerRead.CACHED)
        if owners is None and not error:
            return None, 0
        return replace(snapshot, **owner_fields(owners, error)), owners.requests if owners is not None else 0


def early_request(spec: GPUEfficiencyPolicySpec, now: float) -> FetchRequest:
    """The fetch request as far as it is known before the nodes are read: no fault hints, no targets."""
    reads = engine.reads(spec, nodes=())
    return FetchRequest(
        now=now,
        windows=reads.windows,
        scrape_interval=reads.scrape_interval_s,
        activity=ActivityHints(idle_below=reads.idle_below),
    )


def no_series_message(matchers: str) -> str:
    """What a cycle that found no GPU series says: the matcher it used and how to check it."""
    used = f"matcher {matchers}" if matchers else "no matcher (any job)"
    return (
        f"no dcgm-exporter series found with the {used}: is dcgm-exporter (or the node agent) scraped, "
        'and under which job? Check with count by (job) ({__name__=~"DCGM_FI_DEV_(GPU_UTIL|FB_USED).*"}) '
        "and set --prometheus-matchers to match"
    )


def owner_fields(owners: OwnerState | None, error: str) -> dict[str, Any]:
    """The snapshot's owner fields from one read (``None`` and no error: not read this cycle)."""
    return {
        "owners": owners.objects if owners is not None else ({} if error else None),
        "autoscalers": owners.autoscalers if owners is not None else {},
        "owners_error": error,
        "disruption_budgets": owners.disruption_budgets if owners is not None else (),
    }
