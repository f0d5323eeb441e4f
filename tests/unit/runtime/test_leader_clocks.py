"""Leader election under skewed wall clocks, and the guard the actuators ask before each write (issue 19, 3).

Two electors share an in-memory Lease API (resourceVersion conflicts as the API server answers
them) and one monotonic timeline; their wall clocks differ by the skew. At every half second of a
simulated run at most one of them may believe it leads, and after the leader stops renewing the
other takes over within a lease duration plus one retry period.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.unit.actuators.test_nodes import FakeCore, make_node

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.engine.model import EvictPod, TaintNode
from gpu_efficiency.engine.outcomes import Result
from gpu_efficiency.runtime.leader import LeaderElector

LEASE_S = 15.0
PERIOD_S = LEASE_S / 3  # the elector's retry and renew period
WALL0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


class LeaseApi:
    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        if self.lease is None:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease) -> client.V1Lease:
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease) -> client.V1Lease:
        assert self.lease is not None
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        return self._store(body)

    def _store(self, body: client.V1Lease) -> client.V1Lease:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease.metadata.resource_version = str(self.version)
        return copy.deepcopy(self.lease)


class Timeline:
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t


def elector(api: LeaseApi, timeline: Timeline, identity: str, skew_s: float) -> LeaderElector:
    e = LeaderElector(
        client.ApiClient(),
        namespace="ns",
        name="lease",
        identity=identity,
        lease_seconds=LEASE_S,
        monotonic=timeline.monotonic,
        wall=lambda: WALL0 + timedelta(seconds=timeline.t + skew_s),
    )
    e.api = api  # type: ignore[assignment]
    return e


@pytest.mark.parametrize("skew_s", [12.0, -12.0, 60.0])
@pytest.mark.parametrize("offset_s", [1.0, 2.5, 4.0])
def test_skewed_clocks_never_give_two_leaders(skew_s: float, offset_s: float) -> None:
    api, timeline = LeaseApi(), Timeline()
    a, b = elector(api, timeline, "a", 0.0), elector(api, timeline, "b", skew_s)
    stop_a = 60.0  # a stops renewing (paused or killed) here
    next_a, next_b = 0.0, offset_s
    b_led_at = None
    while timeline.t <= 120.0:
        if timeline.t >= next_a and timeline.t < stop_a:
            a.try_acquire_or_renew()
            next_a += PERIOD_S
        if timeline.t >= next_b:
            b.try_acquire_or_renew()
            next_b += PERIOD_S
        assert not (a.is_leader() and b.is_leader()), f"two leaders at t={timeline.t}"
        if b.is_leader() and b_led_at is None:
            b_led_at = timeline.t
        timeline.t += 0.5
    assert b_led_at is not None
    assert stop_a < b_led_at <= stop_a + LEASE_S + PERIOD_S


def test_a_candidate_counts_a_foreign_lease_from_when_it_saw_it_change() -> None:
    """A lease whose renewTime is long past on the candidate's clock is still held while it changes."""
    api, timeline = LeaseApi(), Timeline()
    a, b = elector(api, timeline, "a", -3600.0), elector(api, timeline, "b", 0.0)
    assert a.try_acquire_or_renew()
    timeline.t = 1.0
    assert not b.try_acquire_or_renew()  # renewTime is an hour old on b's clock: not expired
    timeline.t = 1.0 + LEASE_S + 0.5  # unchanged for more than a lease: expired
    assert b.try_acquire_or_renew()
    assert not a.still_leader()


def test_the_guard_turns_false_when_the_term_ends_mid_cycle() -> None:
    api, timeline = LeaseApi(), Timeline()
    a = elector(api, timeline, "a", 0.0)
    assert a.try_acquire_or_renew()
    timeline.t = LEASE_S * 2 / 3 - 0.5
    assert a.still_leader()
    timeline.t = LEASE_S * 2 / 3
    assert not a.still_leader()


class _Core(FakeCore):
    def __init__(self) -> None:
        super().__init__(make_node("n1"))
        self.evicted: list[str] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any) -> None:
        self.evicted.append(name)


class _Events:
    def record(self, *args: Any, **kwargs: Any) -> None: ...


def test_the_applier_asks_the_guard_before_each_write() -> None:
    core, answers = _Core(), iter([True, False, False])
    applier = Applier(client.ApiClient(), _Events(), still_leader=lambda: next(answers))  # type: ignore[arg-type]
    applier.core = core  # type: ignore[assignment]
    outcomes = applier.apply(
        [
            EvictPod(namespace="ns", name="a", uid="ua", reason="idle"),
            TaintNode(node="n1", kind="xid", effect="NoSchedule"),
            EvictPod(namespace="ns", name="b", uid="ub", reason="idle"),
        ],
        policy_name="p",
        policy_uid="u",
    )
    assert [o.result for o in outcomes] == [Result.DONE, Result.SKIPPED, Result.SKIPPED]
    assert core.evicted == ["a"]
    assert not core.nodes["n1"].spec.taints
