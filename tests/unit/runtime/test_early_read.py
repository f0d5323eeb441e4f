"""The cycle starts what its metrics fetch reads whatever the cluster holds before it reads the nodes
(``base.EarlyReads``): a restart's whole activity window overlaps the informers' first LIST."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.unit.runtime.cycle_harness import OneSource

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import Window
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.runtime.deps import WithoutCredentials
from gpu_efficiency.sources.kube.cluster import ClusterState
from gpu_efficiency.sources.metrics.base import FetchRequest, FetchResult, StaticSource
from gpu_efficiency.sources.metrics.combined import CombinedSource

EMPTY = ClusterState(pods=(), nodes=(), namespaces=(), requests=0)


@dataclass
class _Log:
    calls: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class _Reader:
    log: _Log

    def read(self) -> ClusterState:
        return EMPTY

    def read_nodes(self) -> ClusterState:
        self.log.calls.append(("nodes", None))
        return EMPTY

    def read_pods(self, state: ClusterState) -> ClusterState:
        return state


@dataclass
class _Early:
    log: _Log

    def read_early(self, request: FetchRequest) -> None:
        self.log.calls.append(("early", request))

    def fetch(self, request: FetchRequest) -> FetchResult:
        self.log.calls.append(("fetch", request))
        return FetchResult(gpus=())


def _observe(source: Any, log: _Log) -> None:
    runner: Any = CycleRunner(
        config=OperatorConfig(),
        reader=_Reader(log),
        applier=None,  # type: ignore[arg-type]
        status_writer=None,  # type: ignore[arg-type]
        source_for=OneSource(source),
        leader=None,  # type: ignore[arg-type]
        clock=lambda: 1000.0,
    )
    runner.observe("p", 1, GPUEfficiencyPolicySpec(), GPUEfficiencyPolicyStatus())


def test_the_early_read_starts_before_the_nodes_with_the_fetchs_time_and_windows() -> None:
    log = _Log()
    _observe(_Early(log), log)
    assert [what for what, _ in log.calls] == ["early", "nodes", "fetch"]
    early, fetch = log.calls[0][1], log.calls[2][1]
    assert early.now == fetch.now == 1000.0
    assert early.windows == fetch.windows
    assert early.windows[Window.ACTIVITY] > 0
    assert early.scrape_interval == fetch.scrape_interval
    assert early.activity == fetch.activity
    assert early.hints is None  # they come from the nodes
    assert early.targets is None
    assert fetch.hints is not None
    assert fetch.targets is not None


def test_wrappers_pass_the_early_read_on_and_sources_without_one_are_fetched_as_before() -> None:
    for wrap in (
        lambda inner: CombinedSource(inner, StaticSource(), 60.0),
        lambda inner: WithoutCredentials(inner, "http://prometheus.test"),
    ):
        log = _Log()
        _observe(wrap(_Early(log)), log)
        assert [what for what, _ in log.calls] == ["early", "nodes", "fetch"]
    log = _Log()
    plain = StaticSource()
    _observe(plain, log)
    assert [what for what, _ in log.calls] == ["nodes"]
    assert plain.calls == 1
