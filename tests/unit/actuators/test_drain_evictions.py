"""A fault drain's evictions go through the idle evictor's front door, with events naming the fault."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.unit.actuators.test_eviction_429 import PDB

from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.api import names
from gpu_efficiency.engine.model import DrainPod
from gpu_efficiency.engine.outcomes import Result
from gpu_efficiency.sources.kube.cluster import pod_view


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, ref: Any, reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((ref.kind, ref.name, reason, message))


class _Core:
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.evicted: list[tuple[str, str, str]] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any) -> None:
        if self.refuse:
            raise ApiException(status=429, reason="Too Many Requests", body=orjson.dumps(PDB).decode())
        self.evicted.append((namespace, name, body.delete_options.preconditions.uid))


ACTION = DrainPod(
    namespace="team", name="victim", uid="u1", node="n1", reason="evicted: GPU 3 on node n1 has a xid fault"
)


def _apply(refuse: bool) -> tuple[Any, _Core, _Events]:
    events = _Events()
    applier = Applier(api_client=client.ApiClient(), recorder=events)  # type: ignore[arg-type]
    core = _Core(refuse)
    applier.core = core  # type: ignore[assignment]
    (outcome,) = applier.apply([ACTION], policy_name="p", policy_uid="pu")
    return outcome, core, events


def test_a_drain_eviction_uses_the_eviction_api_with_the_uid_and_tells_pod_and_node() -> None:
    outcome, core, events = _apply(refuse=False)
    assert outcome.result is Result.DONE
    assert outcome.action == ACTION
    assert core.evicted == [("team", "victim", "u1")]
    assert [(kind, name, reason) for kind, name, reason, _ in events.recorded] == [
        ("Pod", "victim", names.EV_DRAINED),
        ("Node", "n1", names.EV_DRAINED),
    ]
    assert "GPU 3 on node n1 has a xid fault" in events.recorded[0][3]


def test_a_disruption_budget_refusal_is_blocked_and_said_on_the_pod() -> None:
    outcome, _, events = _apply(refuse=True)
    assert outcome.result is Result.BLOCKED
    ((kind, name, reason, message),) = events.recorded
    assert (kind, name, reason) == ("Pod", "victim", names.EV_EVICTION_BLOCKED)
    assert "retried next cycle until the drain timeout" in message


def test_pods_keep_only_the_tolerations_that_can_match_our_fault_taint() -> None:
    view = pod_view(
        {
            "metadata": {"name": "p", "namespace": "team", "uid": "u"},
            "spec": {
                "nodeName": "n1",
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": names.FAULT_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"},
                    {"operator": "Exists"},
                ],
            },
        }
    )
    assert [(t.key, t.effect) for t in view.fault_tolerations] == [
        (names.FAULT_TAINT_KEY, "NoExecute"),
        ("", ""),
    ]
