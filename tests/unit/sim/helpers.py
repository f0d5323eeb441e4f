"""Shared builders for the simulator unit tests."""

from __future__ import annotations

from gpu_efficiency_sim.allocation import PodInfo
from gpu_efficiency_sim.faults import Fault
from gpu_efficiency_sim.gpu_models import find_model
from gpu_efficiency_sim.simulator import SimNode, SimOptions, Simulator, WorkloadPlay


class FakeClock:
    """A clock the test moves by hand; starts at 1000 so t0 is not 0."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def at(self, t: float, sim: Simulator) -> None:
        """Move so that sim.elapsed() == t."""
        self.now = 1000.0 + t


def pod(
    name: str,
    node: str,
    gpus: int = 1,
    *,
    namespace: str = "ns",
    created: str = "2026-01-01T00:00:00Z",
    uid: str | None = None,
    workload: str | None = None,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> PodInfo:
    labels = {"sim.gpuefficiency.io/workload": workload} if workload else {}
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid or f"uid-{name}",
        node=node,
        created=created,
        containers=(("main", gpus),),
        labels=labels,
        annotations=annotations or {},
        phase=phase,
    )


def simulator(
    nodes: int = 1,
    gpus: int = 2,
    *,
    model: str = "NVIDIA-H100-80GB-HBM3",
    workloads: tuple[WorkloadPlay, ...] = (),
    faults: tuple[Fault, ...] = (),
    options: SimOptions | None = None,
    prefix: str = "node-",
) -> tuple[Simulator, FakeClock]:
    clock = FakeClock()
    sim = Simulator(
        [SimNode(f"{prefix}{i}", gpus, find_model(model)) for i in range(nodes)],
        workloads=workloads,
        faults=faults,
        options=options,
        clock=clock,
    )
    return sim, clock
