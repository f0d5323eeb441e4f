"""A 429 from the Eviction API: a PodDisruptionBudget's refusal is a block; API Priority and
Fairness throttling is not (no eviction-blocked annotation, no EvictionBlocked event), only retried."""

from __future__ import annotations

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.pods import evict_pod
from gpu_efficiency.engine.model import EvictPod
from gpu_efficiency.engine.outcomes import Result

PDB = {
    "kind": "Status",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget nb needs 1 healthy pods and has 1",
            }
        ]
    },
    "code": 429,
}
PDB_OLD = {
    "kind": "Status",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "code": 429,
}
APF = {
    "kind": "Status",
    "status": "Failure",
    "message": "Too many requests, please try again later.",
    "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 4},
    "code": 429,
}


class RefusingCore:
    def __init__(self, doc: dict[str, object], headers: dict[str, str]) -> None:
        self.doc, self.headers = doc, headers

    def create_namespaced_pod_eviction(self, *_: object) -> None:
        exc = ApiException(status=429, reason="Too Many Requests", body=orjson.dumps(self.doc).decode())
        exc.headers = self.headers
        raise exc


ACTION = EvictPod(namespace="ns", name="nb", uid="u1", reason="idle")


@pytest.mark.parametrize("doc", [PDB, PDB_OLD], ids=["cause", "message only"])
def test_a_disruption_budget_refusal_is_blocked(doc: dict[str, object]) -> None:
    outcome = evict_pod(RefusingCore(doc, {}), ACTION)  # type: ignore[arg-type]
    assert outcome.result is Result.BLOCKED
    assert "disruption budget" in outcome.message


def test_api_priority_and_fairness_throttling_is_not_a_budget_block() -> None:
    outcome = evict_pod(RefusingCore(APF, {"Retry-After": "4"}), ACTION)  # type: ignore[arg-type]
    assert outcome.result is Result.SKIPPED
    assert (
        outcome.message == "API server throttled the eviction (HTTP 429, Retry-After 4s): retried next cycle"
    )
