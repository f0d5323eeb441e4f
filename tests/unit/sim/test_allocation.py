"""GPU index assignment: device-plugin-like, stable, and released when pods go."""

from __future__ import annotations

from gpu_efficiency_sim.allocation import GPUAllocator, pod_from_json
from tests.unit.sim.helpers import pod


def held(result: dict[tuple[str, int], object]) -> dict[tuple[str, int], str]:
    return {k: h.pod.name for k, h in result.items()}  # type: ignore[attr-defined]


def test_pods_get_the_lowest_free_indexes_in_creation_order() -> None:
    a = pod("a", "n0", 2, created="2026-01-01T00:00:02Z")
    b = pod("b", "n0", 1, created="2026-01-01T00:00:01Z")
    result = held(GPUAllocator().update({"n0": 4}, [a, b]))
    assert result == {("n0", 0): "b", ("n0", 1): "a", ("n0", 2): "a"}


def test_a_pod_keeps_its_gpus_while_others_come_and_go() -> None:
    alloc = GPUAllocator()
    a, b = pod("a", "n0", created="2026-01-01T00:00:01Z"), pod("b", "n0", created="2026-01-01T00:00:02Z")
    alloc.update({"n0": 4}, [a, b])
    c = pod("c", "n0", created="2026-01-01T00:00:03Z")
    result = held(alloc.update({"n0": 4}, [b, c]))  # a deleted, c new: c reuses a's index 0
    assert result == {("n0", 0): "c", ("n0", 1): "b"}
    d = pod("d", "n0", 2, created="2026-01-01T00:00:00Z")  # older timestamp, but arrives later
    result = held(alloc.update({"n0": 4}, [b, c, d]))
    assert result[("n0", 1)] == "b"
    assert result[("n0", 0)] == "c"
    assert {result[("n0", 2)], result[("n0", 3)]} == {"d"}


def test_a_restarted_allocator_reproduces_the_assignment() -> None:
    pods = [pod(f"p{i}", "n0", 1 + i % 2, created=f"2026-01-01T00:00:0{i}Z") for i in range(4)]
    first = held(GPUAllocator().update({"n0": 8}, pods))
    again = held(GPUAllocator().update({"n0": 8}, list(reversed(pods))))
    assert first == again


def test_finished_pods_and_pods_on_other_nodes_hold_nothing() -> None:
    pods = [
        pod("done", "n0", phase="Succeeded"),
        pod("failed", "n0", phase="Failed"),
        pod("pending", ""),
        pod("elsewhere", "other"),
        pod("running", "n0"),
    ]
    assert held(GPUAllocator().update({"n0": 2}, pods)) == {("n0", 0): "running"}


def test_an_overcommitted_pod_gets_nothing_rather_than_a_shared_gpu() -> None:
    result = held(
        GPUAllocator().update(
            {"n0": 2}, [pod("a", "n0", 2), pod("b", "n0", 1, created="2026-02-01T00:00:00Z")]
        )
    )
    assert result == {("n0", 0): "a", ("n0", 1): "a"}


def test_pod_from_json_reads_gpu_limits_and_skips_cpu_pods() -> None:
    obj = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"x": "y"}, "deletionTimestamp": "2026-01-01T00:01:00Z"},
        "spec": {"nodeName": "n0", "containers": [
            {"name": "side", "resources": {"requests": {"cpu": "1"}}},
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        ]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    info = pod_from_json(obj)
    assert info is not None
    assert (info.containers, info.node, info.deleting, info.gpus) == ((("main", 2),), "n0", True, 2)
    assert pod_from_json({"metadata": {"name": "cpu"}, "spec": {"containers": [{"name": "c"}]}}) is None
