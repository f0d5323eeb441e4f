"""Time-sliced GPUs (several pods on one GPU UUID) and owner reclamation: an idle pod sharing a GPU
with a busy one is never reclaimed, and a GPU whose pods are all idle is reclaimed once."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import enforce, gpu, no_faults, snapshot  # noqa: F401 (fixture)
from tests.unit.engine.owner_builders import chain, due_annotations, owned, with_owners

from gpu_efficiency.api import names
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.engine.model import EvictPod, OwnerObject, PodView, ReclaimOwner, Verdict
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.reclaimproof import advance

pytestmark = pytest.mark.usefixtures("no_faults")


def sliced_deployment(name: str, replicas: int) -> tuple[list[PodView], list[OwnerObject]]:
    rs = f"{name}-5d9"
    pods = [owned(f"{name}-{i}", ("ReplicaSet", rs), annotations=due_annotations()) for i in range(replicas)]
    return pods, chain(("ReplicaSet", rs), ("Deployment", name), replicas=replicas)


def test_replicas_sharing_one_idle_gpu_are_one_reclaim_that_frees_one_gpu() -> None:
    pods, objects = sliced_deployment("nb", 3)
    shared = gpu("GPU-0", b.idle(), *((p.namespace, p.name) for p in pods))
    plan = plan_cycle(with_owners(snapshot([shared], pods, enforce()), objects))
    reclaims = [a for a in plan.actions if isinstance(a, ReclaimOwner)]
    assert [(a.action, a.owner.name, len(a.pods)) for a in reclaims] == [("ScaleToZero", "nb", 3)]
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    (record,) = [r for _, r in plan.reclamations]
    assert record.gpus == 1, "three shares of one GPU free one GPU, not three"


def test_an_idle_pod_sharing_its_gpu_with_a_busy_pod_is_never_reclaimed() -> None:
    pods, objects = sliced_deployment("nb", 1)
    trainer = owned("trainer", None)  # a bare pod, busy on the same GPU
    shared = gpu("GPU-0", b.compute_bound(), ("team-a", "nb-0"), ("team-a", "trainer"))
    plan = plan_cycle(with_owners(snapshot([shared], [*pods, trainer], enforce()), objects))
    verdicts = {v.name: v.verdict for v in plan.verdicts}
    assert verdicts["nb-0"] is not Verdict.IDLE
    assert not [a for a in plan.actions if isinstance(a, ReclaimOwner | EvictPod)]
    patches = {a.name: a.annotations for a in plan.actions if hasattr(a, "annotations")}
    assert patches.get("nb-0", {}).get(names.EVICT_AFTER, "") is None, "its warning is withdrawn"


def test_a_gpu_whose_pods_are_all_idle_is_freed_once_even_when_one_pod_holds_two_shares() -> None:
    pods, objects = sliced_deployment("nb", 2)
    big = replace(pods[1], gpu_request=2)  # two shares of the same GPU
    shared = gpu("GPU-0", b.idle(), ("team-a", "nb-0"), ("team-a", "nb-1"))
    plan = plan_cycle(with_owners(snapshot([shared], [pods[0], big], enforce()), objects))
    (record,) = [r for _, r in plan.reclamations]
    assert record.gpus == 1


def test_bare_pods_time_sliced_on_one_gpu_and_reclaimed_apart_return_its_hours_once() -> None:
    """Two bare pods of different people share GPU-0, both idle: each is evicted (each is its own
    owner), but together they free one GPU, so GPU-hours returned count it once."""
    first, second = (
        owned("nb-a", None, annotations=due_annotations()),
        owned("nb-b", None, annotations=due_annotations()),
    )
    shared = gpu("GPU-0", b.idle(), ("team-a", "nb-a"), ("team-a", "nb-b"))
    spec = enforce(eviction={"allow_bare_pods": True})
    plan = plan_cycle(with_owners(snapshot([shared], [first, second], spec), []))
    records = [r for _, r in plan.reclamations]
    assert [r.owner for r in records] == ["team-a/Pod/nb-a", "team-a/Pod/nb-b"]
    assert [(r.gpus, r.gpu_ids) for r in records] == [(1, ["GPU-0"]), (1, ["GPU-0"])]
    advanced, returned = advance(records, [], None, now=0.0, hours=2.0)
    assert returned == 2.0, "one GPU for two hours, not two"
    assert [r.gpu_hours_returned for r in advanced] == [2.0, 0.0]


def test_records_whose_gpus_are_unknown_count_their_gpu_requests() -> None:
    one = Reclamation(owner="ns/Pod/a", action="Evict", time="2026-01-01T00:00:00Z", gpus=2)
    other = Reclamation(owner="ns/Pod/b", action="Evict", time="2026-01-01T00:00:00Z", gpus=1)
    _, returned = advance([one, other], [], None, now=0.0, hours=1.0)
    assert returned == 3.0
