"""The hour's eviction budget holds when API calls fail and when leadership changes (issue 19, 2).

A real CycleRunner (engine, applier, status writer) runs against in-memory fakes of the API: 20 pods
are due for eviction, ``maxPerHour`` is 5, and each test injects one fault: the status PATCH fails,
the follow-up Events are refused with 429, another replica's status waits on the server when a
term starts, or another writer changes the status between our read and our write.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, no_faults  # noqa: F401 (fixture)
from tests.unit.runtime.cycle_harness import OneSource

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.status import StatusWriter
from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import PodView
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.sources.kube.cluster import ClusterState
from gpu_efficiency.sources.metrics.base import FetchRequest, FetchResult

pytestmark = pytest.mark.usefixtures("no_faults")

POLICY = "budget"
MAX_PER_HOUR = 5
SPEC = b.enforce(eviction={"max_per_cycle": MAX_PER_HOUR, "max_per_hour": MAX_PER_HOUR}).model_dump(
    by_alias=True, mode="json", exclude_none=True
)


def injected(status: int) -> ApiException:
    return ApiException(status=status, reason="Injected")


def due(i: int) -> PodView:
    """An idle pod in its own namespace whose warning period is over."""
    return b.pod(
        f"p{i:02d}",
        f"ns{i:02d}",
        annotations={
            names.IDLE_SINCE: format_rfc3339(NOW - 3600),
            names.EVICT_AFTER: format_rfc3339(NOW - 60),
            names.STATE: "Warned",
        },
    )


class Cluster:
    """Pods as the API server holds them: an accepted eviction removes the pod."""

    def __init__(self, pods: int) -> None:
        self.pods = {p.uid: p for p in (due(i) for i in range(pods))}
        self.evicted: list[str] = []

    # the ClusterSource the runner reads
    def read_nodes(self) -> ClusterState:
        return ClusterState(pods=(), nodes=(b.node(),), namespaces=(), requests=0)

    def read_pods(self, state: ClusterState) -> ClusterState:
        return ClusterState(pods=tuple(self.pods.values()), nodes=state.nodes, namespaces=(), requests=0)

    def pod_written(self, obj: Mapping[str, Any]) -> None: ...
    def node_written(self, obj: Mapping[str, Any]) -> None: ...
    def pod_evicted(self, uid: str) -> None: ...

    # the CoreV1Api calls the applier makes
    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any) -> None:
        uid = body.delete_options.preconditions.uid
        if uid not in self.pods:
            raise injected(404)
        del self.pods[uid]
        self.evicted.append(f"{namespace}/{name}")

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        class Response:
            data = orjson.dumps({"metadata": {"name": name, "namespace": namespace}})

        return Response()


@dataclass
class Source:
    """Idle samples for every pod still there, as fresh as the cycle."""

    cluster: Cluster

    def fetch(self, request: FetchRequest) -> FetchResult:
        gpus = [
            b.shift_stats(b.gpu(f"GPU-{p.namespace}-{p.name}", b.idle(), (p.namespace, p.name)), request.now)
            for p in self.cluster.pods.values()
        ]
        return FetchResult(gpus=tuple(gpus))


@dataclass
class Events:
    fail_with: int | None = None
    recorded: list[str] = field(default_factory=list)

    def record(self, ref: Any, reason: str, message: str, type_: str = "Normal") -> None:
        if self.fail_with is not None:
            raise injected(self.fail_with)
        self.recorded.append(reason)


class PolicyApi:
    """The policy object with its status subresource: resourceVersion preconditions, merge patch."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] = {"metadata": {"name": POLICY, "resourceVersion": "1"}, "status": {}}
        self.fail_patches: int = 0  # how many status PATCHes fail with 500 from now on

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> Any:
        return copy.deepcopy(self.obj)

    def patch_cluster_custom_object_status(
        self, group: str, version: str, plural: str, name: str, body: Any, **_: Any
    ) -> Any:
        if self.fail_patches:
            self.fail_patches -= 1
            raise injected(500)
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != self.obj["metadata"]["resourceVersion"]:
            raise injected(409)
        self.obj["status"] = {**self.obj["status"], **body["status"]}
        self.bump()
        return copy.deepcopy(self.obj)

    def bump(self) -> None:
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    @property
    def recent(self) -> list[str]:
        return list(self.obj["status"].get("recentEvictions") or [])


class Leader:
    transitions = 1

    def is_leader(self) -> bool:
        return True

    def still_leader(self) -> bool:
        return True

    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Replica:
    runner: CycleRunner
    events: Events
    leader: Leader
    now: list[float]

    def cycle(self, advance: float = 60.0) -> None:
        """One scheduled cycle: as in the scheduler, a cycle that raises is retried next interval."""
        with contextlib.suppress(ApiException):
            self.runner.run(name=POLICY, uid="uid-policy", generation=1, spec_raw=SPEC, status_raw={})
        self.now[0] += advance


def replica(cluster: Cluster, api: PolicyApi) -> Replica:
    events, leader, now = Events(), Leader(), [NOW]
    applier = Applier(api_client=client.ApiClient(), recorder=events)  # type: ignore[arg-type]
    applier.core = cluster  # type: ignore[assignment]
    writer = StatusWriter(client.ApiClient())
    writer.custom = api  # type: ignore[assignment]
    runner = CycleRunner(
        config=OperatorConfig(),
        reader=cluster,  # type: ignore[arg-type]
        applier=applier,
        status_writer=writer,
        source_for=OneSource(Source(cluster)),
        leader=leader,
        clock=lambda: now[0],
    )
    return Replica(runner, events, leader, now)


def test_a_failed_status_write_keeps_the_evictions_counted() -> None:
    cluster, api = Cluster(20), PolicyApi()
    one = replica(cluster, api)
    api.fail_patches = 3  # the writes after the first three cycles fail
    for _ in range(10):
        one.cycle()
    assert len(cluster.evicted) == MAX_PER_HOUR
    assert len(api.recent) == MAX_PER_HOUR  # written once the API answered again


def test_refused_events_do_not_turn_an_accepted_eviction_into_a_failure() -> None:
    cluster, api = Cluster(20), PolicyApi()
    one = replica(cluster, api)
    one.events.fail_with = 429
    for _ in range(3):
        one.cycle()
    assert len(cluster.evicted) == MAX_PER_HOUR
    assert len(api.recent) == MAX_PER_HOUR
    assert api.obj["status"]["evictionsTotal"] == MAX_PER_HOUR


def test_a_new_term_starts_from_the_servers_budget_not_from_memory() -> None:
    cluster, api = Cluster(0), PolicyApi()
    first, second = replica(cluster, api), replica(cluster, api)
    second.cycle(advance=0)  # led once before, at NOW, with nothing to evict: its memory says 0
    cluster.pods.update({p.uid: p for p in (due(i) for i in range(20))})
    first.now[0] = NOW + 60
    first.cycle()  # the other replica leads and spends the hour's budget
    assert len(cluster.evicted) == MAX_PER_HOUR
    written_by_first = api.recent
    second.leader.transitions += 1  # the second replica leads again
    second.now[0] = NOW + 600
    second.cycle()
    assert len(cluster.evicted) == MAX_PER_HOUR, "the new leader evicted past the hour's budget"
    assert api.recent == written_by_first


def test_a_term_start_keeps_evictions_this_replica_could_not_write() -> None:
    cluster, api = Cluster(20), PolicyApi()
    one = replica(cluster, api)
    api.fail_patches = 1
    one.cycle()  # evicts 5, its status write fails
    one.leader.transitions += 1  # it loses and wins the lease back before writing
    one.cycle()
    assert len(cluster.evicted) == MAX_PER_HOUR
    assert len(api.recent) == MAX_PER_HOUR


def test_a_conflicting_status_write_is_merged_not_overwritten() -> None:
    cluster, api = Cluster(20), PolicyApi()
    one = replica(cluster, api)
    one.cycle()
    assert len(api.recent) == MAX_PER_HOUR
    # Another writer adds its own record after our last read (e.g. a replica that thought it led).
    other = format_rfc3339(NOW + 30)
    api.obj["status"]["recentEvictions"] = [*api.recent, other]
    api.obj["status"]["evictionsTotal"] = MAX_PER_HOUR + 1
    api.bump()
    cluster.pods.update({p.uid: p for p in (due(i) for i in range(20, 23))})
    one.cycle()
    assert len(cluster.evicted) == MAX_PER_HOUR  # its status was written after its plan: no extra
    assert other in api.recent
    assert len(api.recent) == MAX_PER_HOUR + 1
