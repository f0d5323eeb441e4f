"""Safety rule 9's second source: a drain or NoExecute waits until a second source agrees.

Where a GPU's node agent and its scrape target both report it, both must show the fault; where
only one does, the fault must show again in a sample newer than its detection (the next scrape).
A NoSchedule quarantine from one trusted reading stays as it was: it evicts nothing.
"""

from __future__ import annotations

from dataclasses import replace

from tests.unit.engine.quarantine.support import NOW, gpu, node, policy, st
from tests.unit.engine.quarantine.test_dra import XID_48, eight
from tests.unit.engine.quarantine.test_drain import DrainCluster, dra_cluster, drains, pod

from gpu_efficiency.engine.model import GPUSample, Signal

NODE_NO_EXECUTE = policy(
    xid={"effect": "NoExecute"}, drain_timeout="5m", device_quarantine={"enabled": False}
)
AT_ONCE = policy(device_quarantine={"effect": "NoExecute"}, drain_timeout="0s")
XID_CLEAN = {Signal.XID: st(0)}  # the gauge at 0 all window: no XID


def stale(gpus: list[GPUSample], delta: float) -> list[GPUSample]:
    """The same scrape seen ``delta`` seconds later: ``DrainCluster.cycle`` moves every sample's times
    along with its clock, so these come back with the times of the scrape that raised the fault."""
    return [
        replace(
            g,
            stats={
                w: {s: replace(v, last_timestamp=v.last_timestamp - delta) for s, v in by.items()}
                for w, by in g.stats.items()
            },
        )
        for g in gpus
    ]


def with_agent(gpus: list[GPUSample], agent: dict[int, GPUSample]) -> list[GPUSample]:
    return [replace(g, witness=agent[i]) if i in agent else g for i, g in enumerate(gpus)]


def test_one_scrape_taints_no_schedule_but_neither_drains_nor_sets_no_execute() -> None:
    cluster = dra_cluster(AT_ONCE)  # a zero drain timeout used to go NoExecute in the first cycle
    first = cluster.cycle(eight("n1", g3=XID_48), advance=15)  # cycles within the XID's lookback
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    assert drains(first) == []
    # The next cycles see no newer scrape (the target stopped answering, or the sample repeats):
    # still one reading of the fault.
    for _ in range(3):
        outcome = cluster.cycle(stale(eight("n1", g3=XID_48), cluster.now - NOW), advance=15)
        assert drains(outcome) == []
        assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    cluster.cycle(eight("n1", g3=XID_48))  # a newer scrape shows it again: confirmed
    assert cluster.tainted_devices() == ["gpu-3:NoExecute"]


def test_one_scrape_on_a_node_taint_drains_nothing_until_the_next() -> None:
    cluster = DrainCluster.of(node("n1"), spec=NODE_NO_EXECUTE)
    cluster.pods = {"busy": pod("busy")}
    cluster.uses = None
    faulty = [gpu("n1", 0, fault=XID_48)]
    cluster.cycle(faulty)
    assert cluster.our_taint_values("n1") == ["xid:NoSchedule"]
    assert drains(cluster.cycle(stale(faulty, cluster.now - NOW))) == []
    assert cluster.our_taint_values("n1") == ["xid:NoSchedule"]
    assert drains(cluster.cycle(faulty)) == ["busy"]


def test_the_node_agent_disagreeing_stops_the_drain_and_the_no_execute() -> None:
    cluster = dra_cluster()
    agent = {3: gpu("n1", 3, fault=XID_CLEAN, source="agent")}  # NVML on the node: no XID
    for _ in range(4):
        outcome = cluster.cycle(with_agent(eight("n1", g3=XID_48), agent))
        assert drains(outcome) == []
        assert any("disagree" in n for n in outcome.notes), outcome.notes
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]  # one trusted source: as before
    assert sorted(cluster.pods) == ["bystander", "filler", "victim"]


def test_the_node_agent_agreeing_drains_in_the_next_cycle() -> None:
    cluster = dra_cluster()
    agent = {3: gpu("n1", 3, fault=XID_48, source="agent")}
    cluster.cycle(with_agent(eight("n1", g3=XID_48), agent))
    assert cluster.tainted_devices() == ["gpu-3:NoSchedule"]
    same_scrape = stale(with_agent(eight("n1", g3=XID_48), agent), cluster.now - NOW)
    assert drains(cluster.cycle(same_scrape)) == ["victim"]  # two sources agree: no need to wait


def test_an_agent_without_the_window_is_no_second_source() -> None:
    cluster = dra_cluster()
    blind = {3: gpu("n1", 3, fault={Signal.XID: None}, source="agent")}  # no XID reading: Unknown
    cluster.cycle(with_agent(eight("n1", g3=XID_48), blind))
    assert drains(cluster.cycle(with_agent(eight("n1", g3=XID_48), blind))) == ["victim"]
