"""Simulator fixtures for e2e tests: fake GPU nodes of our own and a registered simulator serving them.

Import the fixtures into a test module (``from tests.e2e.sim_fixtures import gpu_nodes, simulator``);
conftest.py belongs to the harness.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency_sim import manifests
from gpu_efficiency_sim.kube import PodWatcher
from gpu_efficiency_sim.playbook import sim_nodes
from gpu_efficiency_sim.scenario import parse_scenario
from gpu_efficiency_sim.server import MetricsServer
from gpu_efficiency_sim.simulator import SimNode, Simulator
from gpu_efficiency_sim.targets import DEFAULT_JOB, register, targets_dir, unregister
from tests.e2e.harness import Cluster, wait_for


@dataclass
class GPUNodes:
    names: list[str]
    nodes: list[SimNode]
    label: tuple[str, str]  # a label only these nodes carry, for pod node selectors


@dataclass
class RunningSimulator:
    sim: Simulator
    server: MetricsServer
    target: str  # the `simulator` label on every series it serves


@pytest.fixture
def gpu_nodes(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[GPUNodes]:
    """Two fake H100 nodes (4 GPUs each, or ``request.param`` when parametrized indirectly), Ready
    under KWOK, deleted afterwards. They carry the label and the NoSchedule taint ``label`` names, so
    only pods that select and tolerate it land there."""
    run = uuid.uuid4().hex[:6]
    gpus = int(getattr(request, "param", 4))
    scenario = parse_scenario(f"nodes: [{{prefix: simtest-{run}-, count: 2, gpus: {gpus}}}]").scenario
    core = client.CoreV1Api(k8s)
    names = scenario.node_names
    for name in names:
        body = manifests.node(name, scenario.nodes[0], f"simtest-{run}", run)
        core.create_node(body)
        core.patch_node_status(name, {"status": body["status"]})

    def ready() -> bool:
        for name in names:
            conditions = core.read_node(name).status.conditions or []
            if not any(c.type == "Ready" and c.status == "True" for c in conditions):
                return False
        return True

    try:
        wait_for(ready, 60, what="simulated GPU nodes Ready")
        yield GPUNodes(names, sim_nodes(scenario), (manifests.SCENARIO_LABEL, f"simtest-{run}"))
    finally:
        for name in names:
            try:
                core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def simulator(cluster: Cluster, k8s: client.ApiClient, gpu_nodes: GPUNodes) -> Iterator[RunningSimulator]:
    """A simulator for ``gpu_nodes`` watching the real pods, registered with the cluster's Prometheus."""
    sim = Simulator(gpu_nodes.nodes)
    server = MetricsServer(sim).start()
    watcher = PodWatcher(k8s, sim.set_pods).start()
    assert watcher.wait_synced(30), "the simulator could not list pods"
    target = f"simtest-{uuid.uuid4().hex[:6]}"
    directory = cluster.prometheus_targets_dir() or Path(
        os.environ.get("GPUEFF_PROMETHEUS_TARGETS_DIR", targets_dir())
    )
    path = register(
        target, [server.address], directory=directory, labels={"job": DEFAULT_JOB, "simulator": target}
    )
    try:
        yield RunningSimulator(sim, server, target)
    finally:
        unregister(path)
        watcher.stop()
        server.stop()
