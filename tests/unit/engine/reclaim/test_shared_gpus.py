"""Several pods on one GPU UUID: a GPU counts idle for a pod only if every pod on it is idle."""

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    apply_plan,
    enforce,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    pod,
    snapshot,
)

from gpu_efficiency.engine.model import EvictPod, Snapshot, Verdict
from gpu_efficiency.engine.planner import plan_cycle

pytestmark = pytest.mark.usefixtures("no_faults")


def verdicts(snap: Snapshot) -> dict[str, Verdict]:
    return {v.name: v.verdict for v in plan_cycle(snap).verdicts}


def test_two_idle_pods_on_one_gpu_are_both_idle() -> None:
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "a"), ("team-a", "b"))], [pod("a"), pod("b")])
    assert verdicts(snap) == {"a": Verdict.IDLE, "b": Verdict.IDLE}
    assert plan_cycle(snap).status.idle_gpus == 1  # one physical GPU


def test_co_tenant_busy_elsewhere_keeps_pod_from_idle() -> None:
    # a: GPU-0 (idle). b: GPU-0 (idle) and GPU-1 (busy). b is not idle, so GPU-0 is not idle for a.
    gpus = [
        gpu("GPU-0", b.idle(), ("team-a", "a"), ("team-a", "b")),
        gpu("GPU-1", b.compute_bound(), ("team-a", "b")),
    ]
    v = verdicts(snapshot(gpus, [pod("a"), pod("b", gpu_request=2)]))
    assert v["a"] is not Verdict.IDLE
    assert v["b"] is not Verdict.IDLE
    assert v["a"] is not Verdict.UNKNOWN


def test_transitive_sharing() -> None:
    # a-GPU0-b-GPU1-c-GPU2(busy): nobody in the chain is idle
    gpus = [
        gpu("GPU-0", b.idle(), ("ns", "a"), ("ns", "b")),
        gpu("GPU-1", b.idle(), ("ns", "b"), ("ns", "c")),
        gpu("GPU-2", b.compute_bound(), ("ns", "c")),
    ]
    pods = [pod("a", "ns"), pod("b", "ns", gpu_request=2), pod("c", "ns", gpu_request=2)]
    assert Verdict.IDLE not in verdicts(snapshot(gpus, pods)).values()


def test_co_tenant_without_data_makes_pod_unknown_not_idle() -> None:
    gpus = [
        gpu("GPU-0", b.idle(), ("team-a", "a"), ("team-a", "b")),
        gpu("GPU-1", {}, ("team-a", "b")),
    ]
    v = verdicts(snapshot(gpus, [pod("a"), pod("b", gpu_request=2)]))
    assert v == {"a": Verdict.UNKNOWN, "b": Verdict.UNKNOWN}


def test_multi_gpu_pod_idle_only_if_all_gpus_idle() -> None:
    gpus = [gpu("GPU-0", b.idle(), ("ns", "p")), gpu("GPU-1", b.bursty_inference(), ("ns", "p"))]
    assert verdicts(snapshot(gpus, [pod("p", "ns", gpu_request=2)]))["p"] is not Verdict.IDLE
    gpus = [gpu("GPU-0", b.idle(), ("ns", "p")), gpu("GPU-1", b.idle_holding_memory(), ("ns", "p"))]
    assert verdicts(snapshot(gpus, [pod("p", "ns", gpu_request=2)]))["p"] is Verdict.IDLE


def test_any_unknown_gpu_makes_pod_unknown() -> None:
    gpus = [gpu("GPU-0", b.compute_bound(), ("ns", "p")), gpu("GPU-1", {}, ("ns", "p"))]
    assert verdicts(snapshot(gpus, [pod("p", "ns", gpu_request=2)]))["p"] is Verdict.UNKNOWN


def test_shared_idle_pods_are_evicted_each_on_its_own_clock() -> None:
    snap = snapshot(
        [gpu("GPU-0", b.idle(), ("team-a", "a"), ("team-a", "b"))], [pod("a"), pod("b")], enforce()
    )
    evicted = []
    for _ in range(11):
        plan = plan_cycle(snap)
        evicted += [a.name for a in plan.actions if isinstance(a, EvictPod)]
        snap = apply_plan(snap, plan)
    assert sorted(evicted) == ["a", "b"]


def test_same_pod_listed_twice_on_a_gpu_counts_once() -> None:
    sample = gpu("GPU-0", b.idle(), ("ns", "p"), ("ns", "p"))  # two containers
    (v,) = plan_cycle(snapshot([sample], [pod("p", "ns")])).verdicts
    assert v.verdict is Verdict.IDLE
    assert v.gpus == ("GPU-0",)
