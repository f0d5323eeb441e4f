"""Time-sliced GPUs: several pods on one GPU, as the device plugin's time-slicing shares it."""

from __future__ import annotations

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import manifests
from gpu_efficiency_sim.gpu_models import find_model
from gpu_efficiency_sim.kube import node_from_json
from gpu_efficiency_sim.playbook import sim_nodes
from gpu_efficiency_sim.scenario import parse_scenario
from gpu_efficiency_sim.simulator import SimNode, Simulator
from tests.unit.sim.helpers import FakeClock, pod
from tests.unit.sim.test_exposition import samples

SHARED = parse_scenario("nodes: [{name: shared-0, gpus: 2, timeSlicing: 4}]").scenario
BUSY = {"sim.gpuefficiency.io/profile": "compute-bound"}
IDLE = {"sim.gpuefficiency.io/profile": "idle"}


def sliced(gpus: int = 1, slices: int = 2) -> Simulator:
    return Simulator(
        [SimNode("node-0", gpus, find_model("NVIDIA-H100-80GB-HBM3"), slices)], clock=FakeClock()
    )


def by_pod(sim: Simulator, metric: str = Signal.SM_ACTIVE) -> dict[str, tuple[str, float]]:
    """pod -> (GPU UUID, value) of each attributed series."""
    return {
        labels["pod"]: (labels["UUID"], value)
        for labels, value in samples(sim.render(t=3.0))[metric]
        if "pod" in labels
    }


def test_the_node_advertises_gpus_times_replicas_and_says_so() -> None:
    node = manifests.node("shared-0", SHARED.nodes[0], "demo", "r1")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert sim_nodes(SHARED)[0].devices == 8
    served = node_from_json(node)
    assert served is not None
    assert (served.gpus, served.slices) == (2, 4), "serve mode reads the time-slicing back"


def test_pods_sharing_a_gpu_each_get_its_series_and_a_busy_one_keeps_it_busy() -> None:
    sim = sliced()
    sim.set_pods(
        [
            pod("idle", "node-0", created="2026-01-01T00:00:01Z", annotations=IDLE),
            pod("busy", "node-0", created="2026-01-01T00:00:02Z", annotations=BUSY),
        ]
    )
    series = by_pod(sim)
    assert series.keys() == {"idle", "busy"}
    assert series["idle"][0] == series["busy"][0] == sim.uuid_of("node-0", 0), "one GPU, attributed to both"
    assert series["idle"][1] == series["busy"][1] > 0.8, "the GPU is busy for every pod on it"
    assert len(samples(sim.render(t=3.0))[Signal.SM_ACTIVE]) == 2, "no unattributed series for the GPU"
    assert [h.pod.name for h in sim.holders()[("node-0", 0)]] == ["idle", "busy"]


def test_a_gpu_whose_pods_are_all_idle_is_idle_and_shares_fill_the_first_gpu_first() -> None:
    sim = sliced(gpus=2, slices=2)
    sim.set_pods(
        [pod(n, "node-0", created=f"2026-01-01T00:00:0{i}Z", annotations=IDLE) for i, n in enumerate("abc")]
    )
    series = by_pod(sim)
    assert series["a"][0] == series["b"][0] == sim.uuid_of("node-0", 0)
    assert series["c"][0] == sim.uuid_of("node-0", 1)
    assert {v for _, v in series.values()} == {0.0}


def test_without_time_slicing_a_gpu_still_has_one_pod() -> None:
    sim = sliced(gpus=1, slices=1)
    sim.set_pods(
        [
            pod("a", "node-0", created="2026-01-01T00:00:01Z"),
            pod("b", "node-0", created="2026-01-01T00:00:02Z"),
        ]
    )
    assert by_pod(sim).keys() == {"a"}, "the second pod does not fit: left unattributed"
