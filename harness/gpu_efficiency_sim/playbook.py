"""A scenario's simulator inputs: nodes, workload plays, faults and options, with durations in seconds."""

from __future__ import annotations

from gpu_efficiency_sim.exposition import PodLabels
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.scenario import Scenario, seconds
from gpu_efficiency_sim.simulator import SimNode, SimOptions, WorkloadPlay


def sim_nodes(scenario: Scenario) -> list[SimNode]:
    return [
        SimNode(name, spec.gpus, spec.gpu_model, spec.time_slicing, spec.exporter)
        for spec in scenario.nodes
        for name in spec.names
    ]


def workload_plays(scenario: Scenario, namespace_prefix: str = "") -> list[WorkloadPlay]:
    return [
        WorkloadPlay(
            namespace=namespace_prefix + w.namespace,
            name=w.name,
            profile=w.profile,
            changes=tuple(sorted((seconds(c.at), c.profile) for c in w.profile_changes)),
            timeline=tuple(sorted(((seconds(e.at), e.values) for e in w.timeline), key=lambda x: x[0])),
        )
        for w in scenario.workloads
    ]


def sim_faults(scenario: Scenario) -> list[Fault]:
    faults = []
    for f in scenario.faults:
        value: float | str | None
        if f.kind is FaultKind.CLOCK_EVENTS:
            value = f.clock_event_bits()
        elif isinstance(f.value, list):
            value = ",".join(f.value)
        else:
            value = f.value
        faults.append(
            Fault(
                kind=f.kind,
                at=seconds(f.at),
                duration=seconds(f.duration) if f.duration is not None else None,
                node=f.node,
                gpu=f.gpu,
                value=value,
                metric=f.metric,
            )
        )
    return faults


def sim_options(scenario: Scenario) -> SimOptions:
    o = scenario.simulator
    return SimOptions(
        pod_labels=PodLabels(o.pod_labels),
        sm_active=o.sm_active,
        clock_events_metric=o.clock_events_metric,
        driver_version=o.driver_version,
        exporter=o.exporter,
    )
