"""Build the operator's dependencies once at start-up (the typed memo handlers share)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from kubernetes import client

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.events import EventRecorder
from gpu_efficiency.actuators.notify.delivery import Notifier
from gpu_efficiency.actuators.status import StatusWriter
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.apiclient import load_api_client
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import (
    AnnotateNode,
    AnnotatePod,
    DrainPod,
    EvictPod,
    Plan,
    SetNodeCondition,
    Snapshot,
    TaintDevices,
    TaintNode,
    UntaintDevices,
    UntaintNode,
)
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.runtime.leader import AlwaysLeader, LeaderElector
from gpu_efficiency.selfservice.links import Linker, with_links
from gpu_efficiency.selfservice.service import read_key
from gpu_efficiency.sources.kube.cluster import ClusterReader, ClusterSource
from gpu_efficiency.sources.kube.cluster_cache import CachedClusterReader, ClusterCache
from gpu_efficiency.sources.kube.dra import DraReader, DraSource
from gpu_efficiency.sources.kube.dra_cache import DraCache, WatchedDraReader
from gpu_efficiency.sources.kube.owner_cache import OwnerCache, WatchedOwnerReader
from gpu_efficiency.sources.kube.owners import OwnerReader, OwnerSource, api_fetch
from gpu_efficiency.sources.metrics.agent import AgentSource, pod_endpoints, static_endpoints
from gpu_efficiency.sources.metrics.base import (
    FetchRequest,
    FetchResult,
    SampleSource,
    SourceUnavailable,
    read_early,
)
from gpu_efficiency.sources.metrics.combined import CombinedSource
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.credentials import credentials_allowed

log = logging.getLogger(__name__)


class SourceCache:
    """One Prometheus source per distinct URL (policies may override the operator's default), and
    the node agents (found by --agent-urls or by their pods' label in the operator's namespace).

    A source no policy uses any more (its policy deleted, or edited to another URL) is dropped, so
    its connections and cached activity windows do not outlive it."""

    def __init__(self, config: OperatorConfig, api_client: client.ApiClient) -> None:
        self.config = config
        self._sources: dict[tuple[str, float], SampleSource] = {}
        self._used_by: dict[str, tuple[str, float]] = {}  # policy -> the key of its source
        self._lock = threading.Lock()
        core = client.CoreV1Api(api_client)

        def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
            response: Any = core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
            items: list[dict[str, Any]] = orjson.loads(response.data).get("items") or []
            return items

        discover = (
            static_endpoints(config.agent_urls)
            if config.agent_urls
            else pod_endpoints(list_pods, config.namespace)
        )
        self.agents = AgentSource(discover, token_file=config.agent_token_file)

    def __call__(self, policy: str, spec: GPUEfficiencyPolicySpec) -> SampleSource:
        prometheus = self._prometheus(policy, spec)
        if not spec.metrics.node_agent:
            return prometheus
        return CombinedSource(prometheus, self.agents, spec.metrics.prometheus.max_staleness.seconds)

    def forget(self, policy: str) -> None:
        with self._lock:
            self._used_by.pop(policy, None)
            self._prune()

    def cached(self) -> list[tuple[str, float]]:
        """The (URL, query timeout) of each source held."""
        with self._lock:
            return sorted(self._sources)

    def _prune(self) -> None:
        used = set(self._used_by.values())
        for key in [k for k in self._sources if k not in used]:
            del self._sources[key]

    def _prometheus(self, policy: str, spec: GPUEfficiencyPolicySpec) -> SampleSource:
        url = spec.metrics.prometheus.url or self.config.prometheus_url
        timeout = spec.metrics.prometheus.query_timeout.seconds
        with self._lock:
            if self._used_by.get(policy) != (url, timeout):
                self._used_by[policy] = (url, timeout)
                self._prune()
            source = self._sources.get((url, timeout))
            if source is None:
                source = self._sources[(url, timeout)] = self._new_prometheus(url, timeout)
            return source

    def _new_prometheus(self, url: str, timeout: float) -> SampleSource:
        """A source for ``url``, with the operator's credentials and extra headers only where they are
        allowed."""
        config = self.config
        trusted = credentials_allowed(url, config.credential_prefixes)
        headers = config.prometheus_header_map
        has_credentials = bool(config.prometheus_token_file or config.prometheus_basic_auth_file or headers)
        source = PrometheusSource(
            PrometheusConfig(
                url=url,
                token_file=config.prometheus_token_file if trusted else None,
                basic_auth_file=config.prometheus_basic_auth_file if trusted else None,
                ca_file=config.prometheus_ca_file,
                insecure_skip_verify=config.prometheus_insecure,
                timeout=timeout,
                matchers=config.prometheus_matchers,
                max_series=config.prometheus_max_series,
                extra_headers=headers if trusted else {},
            ),
            refresh_budget=config.prometheus_refresh_budget,
        )
        if trusted or not has_credentials:
            return source
        log.warning(
            "Prometheus %s is not under --prometheus-credentials-for: it is queried without credentials"
            " or --prometheus-headers",
            url,
        )
        return WithoutCredentials(source, url)


@dataclass
class WithoutCredentials:
    """A Prometheus source queried without the operator's credentials: its failures say so, so the
    MetricsAvailable condition and event tell the policy's author why (e.g. HTTP 401)."""

    source: SampleSource
    url: str

    def read_early(self, request: FetchRequest) -> None:
        """The wrapped source's early read (its failures reach the fetch, which says why)."""
        read_early(self.source, request)

    def fetch(self, request: FetchRequest) -> FetchResult:
        try:
            return self.source.fetch(request)
        except SourceUnavailable as exc:
            raise SourceUnavailable(
                f"{exc} (no credentials or --prometheus-headers sent: {self.url} is not under the operator's "
                "--prometheus-credentials-for)"
            ) from exc


def build_reader(config: OperatorConfig, api_client: client.ApiClient, *, watch: bool) -> ClusterSource:
    """The watch cache for the long-running operator (unless turned off); a plain LIST per read for
    one-shot commands, which would pay a full LIST to fill a cache they read once."""
    reader = ClusterReader(api_client)
    if watch and config.watch_cache:
        return CachedClusterReader(ClusterCache(api_client), fallback=reader)
    return reader


def build_dra(config: OperatorConfig, api_client: client.ApiClient, *, watch: bool) -> DraSource:
    """ResourceSlices and our DeviceTaintRules: watched for the long-running operator (as the
    cluster cache), LISTed per read for one-shot commands."""
    reader = DraReader(client.CustomObjectsApi(api_client))
    if watch and config.watch_cache:
        return WatchedDraReader(DraCache.for_client(api_client), fallback=reader)
    return reader


def build_owners(config: OperatorConfig, api_client: client.ApiClient, *, watch: bool) -> OwnerSource:
    """The owners: LISTed per read, and watched besides for the long-running operator (the cycles
    that need only a current view of them then make no request)."""
    reader = OwnerReader(api_fetch(api_client))
    if watch and config.watch_cache:
        return WatchedOwnerReader(OwnerCache.for_client(api_client), fallback=reader)
    return reader


_NODE_WRITES = (TaintNode, UntaintNode, SetNodeCondition, AnnotateNode)


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


def feed_writes(reader: ClusterSource, dra: DraSource, outcome: Outcome) -> None:
    """``feed_write``, and a write of our DeviceTaintRules told to the DRA reader (read-your-writes:
    the actuator returns no object to feed back, so the next read lists our rules)."""
    feed_write(reader, outcome)
    if isinstance(outcome.action, (TaintDevices, UntaintDevices)) and outcome.result is not Result.NOOP:
        dra.rules_written()


def build_runner(
    config: OperatorConfig, api_client: client.ApiClient | None = None, *, watch: bool = False
) -> CycleRunner:
    """Everything a cycle needs; ``watch``: the long-running operator (start ``runner.reader``)."""
    api_client = api_client or load_api_client(config.api_timeout)
    recorder = EventRecorder(api_client, instance=config.identity)
    leader: LeaderElector | AlwaysLeader
    if config.leader_election:
        leader = LeaderElector(
            api_client,
            namespace=config.namespace,
            name=config.lease_name,
            identity=config.identity,
            lease_seconds=config.lease_seconds,
        )
    else:
        leader = AlwaysLeader()
    reader = build_reader(config, api_client, watch=watch)
    dra = build_dra(config, api_client, watch=watch)
    return CycleRunner(
        config=config,
        reader=reader,
        applier=Applier(
            api_client,
            recorder,
            dry_run=config.dry_run,
            on_written=partial(feed_writes, reader, dra),
            still_leader=leader.still_leader,
        ),
        status_writer=StatusWriter(api_client, refresh_seconds=config.status_refresh_seconds),
        source_for=SourceCache(config, api_client),
        leader=leader,
        owners=build_owners(config, api_client, watch=watch),
        dra=dra,
        notifier=Notifier(
            config.notify_secret_dir,
            slack_buttons=bool(config.slack_signing_secret_file) and config.selfservice_links,
        )
        if watch
        else None,
        links=self_service_links(config) if watch else None,
    )


def self_service_links(config: OperatorConfig) -> Callable[[Plan, Snapshot], Plan] | None:
    """The step that puts signed links into warnings, where the page is on and has an address."""
    if not config.selfservice_links:
        return None
    return partial(with_links, linker=Linker(read_key(config.selfservice_key_file), config.selfservice_url))
