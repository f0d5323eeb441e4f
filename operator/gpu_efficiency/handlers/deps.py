"""Build the operator's dependencies once at start-up (the typed memo handlers share)."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import orjson
from kubernetes import client
from kubernetes import config as kube_config

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.events import EventRecorder
from gpu_efficiency.actuators.status import StatusWriter
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.handlers.cycle import CycleRunner, feed_write
from gpu_efficiency.handlers.leader import AlwaysLeader, LeaderElector
from gpu_efficiency.sources.agent import AgentSource, pod_endpoints, static_endpoints
from gpu_efficiency.sources.base import SampleSource
from gpu_efficiency.sources.cluster import ClusterReader, ClusterSource
from gpu_efficiency.sources.cluster_cache import CachedClusterReader, ClusterCache
from gpu_efficiency.sources.combined import CombinedSource
from gpu_efficiency.sources.owners import OwnerReader, api_fetch
from gpu_efficiency.sources.prometheus import PrometheusConfig, PrometheusSource


def load_api_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config."""
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 16
    return client.ApiClient(configuration)


class SourceCache:
    """One Prometheus source per distinct URL (policies may override the operator's default), and
    the node agents (found by --agent-urls or by their pods' label in the operator's namespace)."""

    def __init__(self, config: OperatorConfig, api_client: client.ApiClient) -> None:
        self.config = config
        self._sources: dict[tuple[str, float], PrometheusSource] = {}
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
        self.agents = AgentSource(discover)

    def __call__(self, spec: GPUEfficiencyPolicySpec) -> SampleSource:
        prometheus = self._prometheus(spec)
        if not spec.metrics.node_agent:
            return prometheus
        return CombinedSource(prometheus, self.agents, parse_duration(spec.metrics.prometheus.max_staleness))

    def _prometheus(self, spec: GPUEfficiencyPolicySpec) -> PrometheusSource:
        url = spec.metrics.prometheus.url or self.config.prometheus_url
        timeout = parse_duration(spec.metrics.prometheus.query_timeout)
        with self._lock:
            source = self._sources.get((url, timeout))
            if source is None:
                source = self._sources[(url, timeout)] = PrometheusSource(
                    PrometheusConfig(
                        url=url,
                        token_file=self.config.prometheus_token_file,
                        basic_auth_file=self.config.prometheus_basic_auth_file,
                        ca_file=self.config.prometheus_ca_file,
                        insecure_skip_verify=self.config.prometheus_insecure,
                        timeout=timeout,
                        matchers=self.config.prometheus_matchers,
                    ),
                    refresh_budget=self.config.prometheus_refresh_budget,
                )
            return source


def build_reader(config: OperatorConfig, api_client: client.ApiClient, *, watch: bool) -> ClusterSource:
    """The watch cache for the long-running operator (unless turned off); a plain LIST per read for
    one-shot commands, which would pay a full LIST to fill a cache they read once."""
    reader = ClusterReader(api_client)
    if watch and config.watch_cache:
        return CachedClusterReader(ClusterCache(api_client), fallback=reader)
    return reader


def build_runner(
    config: OperatorConfig, api_client: client.ApiClient | None = None, *, watch: bool = False
) -> CycleRunner:
    """Everything a cycle needs; ``watch``: the long-running operator (start ``runner.reader``)."""
    api_client = api_client or load_api_client()
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
    return CycleRunner(
        config=config,
        reader=reader,
        applier=Applier(api_client, recorder, dry_run=config.dry_run, on_written=partial(feed_write, reader)),
        status_writer=StatusWriter(api_client, refresh_seconds=config.status_refresh_seconds),
        source_for=SourceCache(config, api_client),
        leader=leader,
        owners=OwnerReader(api_fetch(api_client)),
    )
