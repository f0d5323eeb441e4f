"""A metric source that fails in an unexpected way makes the cycle blind (metrics unavailable), never
crashes it (issue 19, finding 8): the MetricsAvailable condition and event then say why."""

from __future__ import annotations

from typing import Any

from tests.unit.runtime.cycle_harness import OneSource

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.sources.kube.cluster import ClusterState
from gpu_efficiency.sources.metrics.base import FetchRequest, FetchResult

EMPTY = ClusterState(pods=(), nodes=(), namespaces=(), requests=0)


class _Reader:
    def read(self) -> ClusterState:
        return EMPTY

    def read_nodes(self) -> ClusterState:
        return EMPTY

    def read_pods(self, state: ClusterState) -> ClusterState:
        return state


class _Broken:
    def fetch(self, request: FetchRequest) -> FetchResult:
        return {}.get("data").get("result")  # type: ignore[no-any-return,union-attr]


def test_an_unexpected_source_error_reads_as_metrics_unavailable() -> None:
    runner: Any = CycleRunner(
        config=OperatorConfig(),
        reader=_Reader(),
        applier=None,  # type: ignore[arg-type]
        status_writer=None,  # type: ignore[arg-type]
        source_for=OneSource(_Broken()),
        leader=None,  # type: ignore[arg-type]
        clock=lambda: 1000.0,
    )
    snapshot, _, result = runner.observe("p", 1, GPUEfficiencyPolicySpec(), GPUEfficiencyPolicyStatus())
    assert result is None
    assert not snapshot.metrics_available
    assert snapshot.metrics_error.startswith("metric source failed: AttributeError:")
