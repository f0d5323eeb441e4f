"""A cycle reads the pods' owners only once some pod carries idle-since, and says when it cannot."""

from __future__ import annotations

from typing import Any

from gpu_efficiency.api import names
from gpu_efficiency.handlers.cycle import CycleRunner
from gpu_efficiency.sources.cluster import ClusterState, pod_view
from gpu_efficiency.sources.owners import OwnerState, OwnersUnavailable


class StubOwners:
    def __init__(self, fail: bool = False) -> None:
        self.reads = 0
        self.fail = fail

    def read(self) -> OwnerState:
        self.reads += 1
        if self.fail:
            raise OwnersUnavailable("listing deployments: HTTP 403 Forbidden")
        return OwnerState({}, frozenset(), requests=5)


def runner(owners: Any) -> CycleRunner:
    return CycleRunner(
        config=None,
        reader=None,
        applier=None,
        status_writer=None,
        source_for=None,
        leader=None,
        owners=owners,  # type: ignore[arg-type]
    )


def cluster(*annotations: dict[str, str]) -> ClusterState:
    pods = tuple(
        pod_view(
            {"metadata": {"name": f"p{i}", "namespace": "ml", "annotations": a}, "spec": {}, "status": {}}
        )
        for i, a in enumerate(annotations)
    )
    return ClusterState(pods=pods, nodes=(), namespaces=(), requests=0)


def test_owners_are_read_only_when_some_pod_is_idle() -> None:
    owners = StubOwners()
    assert runner(owners)._read_owners(cluster({}, {names.STATE: "Efficient"})) == (None, "")
    assert owners.reads == 0
    state, error = runner(owners)._read_owners(cluster({}, {names.IDLE_SINCE: "2026-01-01T00:00:00Z"}))
    assert state is not None
    assert (owners.reads, error) == (1, "")


def test_owners_unreadable_is_reported_not_raised() -> None:
    state, error = runner(StubOwners(fail=True))._read_owners(
        cluster({names.IDLE_SINCE: "2026-01-01T00:00:00Z"})
    )
    assert state is None
    assert "HTTP 403" in error


def test_without_an_owner_reader_nothing_is_read() -> None:
    assert runner(None)._read_owners(cluster({names.IDLE_SINCE: "2026-01-01T00:00:00Z"})) == (None, "")


def test_report_reads_owners_before_any_clock_runs() -> None:
    owners = StubOwners()
    one_shot = runner(owners)
    one_shot.read_owners_always = True
    state, _ = one_shot._read_owners(cluster({}))
    assert state is not None
    assert owners.reads == 1
