"""A whole cycle without a cluster: the real CycleRunner, engine and metrics, with in-memory reader,
applier, status writer and sample source. The applier answers evictions ``blocked`` (a
PodDisruptionBudget), the outcome the chart's EvictionsBlocked alert watches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tests.unit.engine import builders as b

from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import Action, EvictPod, GPUSample, NodeView, PodView
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.sources.kube.cluster import ClusterState
from gpu_efficiency.sources.metrics.base import StaticSource


@dataclass
class MemoryReader:
    pods: Sequence[PodView]
    nodes: Sequence[NodeView]

    def read(self) -> ClusterState:
        return self.read_pods(self.read_nodes())

    def read_nodes(self) -> ClusterState:
        return ClusterState(pods=(), nodes=tuple(self.nodes), namespaces=(), requests=1)

    def read_pods(self, state: ClusterState) -> ClusterState:
        return replace(state, pods=tuple(self.pods), requests=state.requests + 1)

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def pod_written(self, obj: Mapping[str, Any]) -> None:
        return None

    def node_written(self, obj: Mapping[str, Any]) -> None:
        return None

    def pod_evicted(self, uid: str) -> None:
        return None


@dataclass
class MemoryApplier:
    writes: int = 0
    applied: list[Action] = field(default_factory=list)

    def apply(self, actions: Iterable[Action], *, policy_name: str, policy_uid: str) -> list[Outcome]:
        outcomes = []
        for action in actions:
            self.applied.append(action)
            blocked = isinstance(action, EvictPod)
            outcomes.append(Outcome(action, Result.BLOCKED if blocked else Result.DONE))
            self.writes += 0 if blocked else 1
        return outcomes


@dataclass
class MemoryStatusWriter:
    written: dict[str, GPUEfficiencyPolicyStatus] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)  # as StatusWriter.problems

    def seed(self, name: str, current: Mapping[str, Any]) -> None:
        return None

    def write(self, name: str, status: GPUEfficiencyPolicyStatus, *, force: bool = False) -> bool:
        changed = self.written.get(name) != status
        self.written[name] = status
        return changed

    def read(self, name: str) -> GPUEfficiencyPolicyStatus | None:
        return self.written.get(name, GPUEfficiencyPolicyStatus())

    def forget(self, name: str) -> None:
        self.written.pop(name, None)


@dataclass
class OneSource:
    """Every policy reads the same source (the cycle's ``SourceFor``)."""

    source: Any

    def __call__(self, policy: str, spec: Any) -> Any:
        return self.source

    def forget(self, policy: str) -> None:
        return None


@dataclass
class SwitchLeader:
    leading: bool = True
    transitions: int = 1

    def is_leader(self) -> bool:
        return self.leading

    def still_leader(self) -> bool:
        return self.leading

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


def warned_idle_pod(name: str, now: float) -> PodView:
    """An idle pod whose warning ran out an hour ago: this cycle tries to evict it."""
    return b.pod(
        name,
        annotations={
            names.STATE: "Warned",
            names.IDLE_SINCE: format_rfc3339(now - 7200),
            names.EVICT_AFTER: format_rfc3339(now - 3600),
        },
    )


def runner(
    gpus: Sequence[GPUSample], pods: Sequence[PodView], *, leader: SwitchLeader | None = None
) -> CycleRunner:
    nodes = [b.node(n) for n in sorted({g.node for g in gpus} | {"node-0"})]
    return CycleRunner(
        config=OperatorConfig(),
        reader=MemoryReader(pods, nodes),
        applier=MemoryApplier(),  # type: ignore[arg-type]
        status_writer=MemoryStatusWriter(),  # type: ignore[arg-type]
        source_for=OneSource(StaticSource(gpus)),
        leader=leader or SwitchLeader(),
        clock=lambda: b.NOW,
    )


ENFORCE_SPEC: dict[str, Any] = {
    "mode": "Enforce",
    "idle": {"idleFor": "5m", "warningPeriod": "5m"},
    "eviction": {"maxPerCycle": 100, "maxPerHour": 1000, "maxPerNamespacePerCycle": 100},
    "pricePerGpuHour": {"default": 2.0},
}


def run_cycle(
    cycle_runner: CycleRunner, name: str = "truth", spec: Mapping[str, Any] | None = None, generation: int = 1
) -> None:
    cycle_runner.run(
        name=name, uid=f"uid-{name}", generation=generation, spec_raw=spec or ENFORCE_SPEC, status_raw={}
    )
