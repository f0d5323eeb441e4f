"""Optional bearer-token authentication (TokenReview + SubjectAccessReview) of /metrics and /snapshot,
with a fake reviewer over a real HTTP server: no cluster needed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gpu_efficiency.agent.auth import Decision, Gate, KubeReviewer, ReviewError, UserInfo
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import AgentServer
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend
from tests.unit.agent.conftest import FAST, gpus

OPERATOR = "system:serviceaccount:gpu-eff:gpueff-gpu-efficiency-operator"


class FakeReviewer:
    """Tokens map to users; ``grants`` lists (user, path) pairs RBAC allows; ``down`` fails every review."""

    def __init__(self) -> None:
        self.tokens = {"op-token": UserInfo(OPERATOR), "tenant-token": UserInfo("system:serviceaccount:ml:x")}
        self.grants = {(OPERATOR, "/metrics"), (OPERATOR, "/snapshot")}
        self.down = False
        self.calls: list[tuple[str, str]] = []

    def authenticate(self, token: str) -> UserInfo | None:
        self.calls.append(("authn", token))
        if self.down:
            raise ReviewError("connection refused")
        return self.tokens.get(token)

    def authorize(self, user: UserInfo, path: str, verb: str) -> bool:
        self.calls.append(("authz", path))
        return verb == "get" and (user.username, path) in self.grants


@pytest.fixture
def reviewer() -> FakeReviewer:
    return FakeReviewer()


@pytest.fixture
def url(reviewer: FakeReviewer) -> Iterator[str]:
    agent = Agent(FakeBackend(gpus(1)), AgentConfig(node_name="node-a", **FAST))
    server = AgentServer(agent, "127.0.0.1:0", gate=Gate(reviewer))
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def _get(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(url, headers=headers, timeout=5)


@pytest.mark.parametrize("path", ["/metrics", "/snapshot"])
def test_data_endpoints_need_a_token_rbac_allows(url: str, path: str) -> None:
    no_token = _get(url + path)
    assert no_token.status_code == 401
    assert no_token.headers["www-authenticate"].startswith("Bearer")
    assert _get(url + path, "forged").status_code == 401
    assert _get(url + path, "tenant-token").status_code == 403
    assert _get(url + path, "op-token").status_code == 200


def test_a_snapshot_for_a_tenant_leaks_no_pods(url: str) -> None:
    response = _get(url + "/snapshot", "tenant-token")
    assert response.status_code == 403
    assert b"gpus" not in response.content


def test_probes_stay_open_for_the_kubelet(url: str) -> None:
    assert _get(url + "/healthz").status_code == 200
    assert _get(url + "/readyz").status_code in (200, 503)  # the agent is not started: not ready, not 401


def test_an_api_server_outage_refuses_and_is_not_cached(url: str, reviewer: FakeReviewer) -> None:
    reviewer.down = True
    assert _get(url + "/metrics", "op-token").status_code == 503
    reviewer.down = False
    assert _get(url + "/metrics", "op-token").status_code == 200


def test_decisions_are_cached_per_token_and_path_for_the_ttl(reviewer: FakeReviewer) -> None:
    now = [0.0]
    gate = Gate(reviewer, ttl_s=60, clock=lambda: now[0])
    for _ in range(5):
        assert gate.check("Bearer op-token", "/metrics") is Decision.ALLOWED
    assert reviewer.calls == [("authn", "op-token"), ("authz", "/metrics")]
    assert gate.check("Bearer op-token", "/snapshot") is Decision.ALLOWED  # another path: another review
    now[0] = 61.0
    reviewer.grants.clear()  # RBAC revoked: seen once the cached decision expires
    assert gate.check("Bearer op-token", "/metrics") is Decision.FORBIDDEN


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic b3A6dG9rZW4=", "op-token"])
def test_malformed_authorization_headers_are_unauthenticated(
    reviewer: FakeReviewer, header: str | None
) -> None:
    assert Gate(reviewer).check(header, "/metrics") is Decision.UNAUTHENTICATED
    assert reviewer.calls == []


def test_the_cache_is_bounded(reviewer: FakeReviewer) -> None:
    gate = Gate(reviewer, max_entries=3)
    for i in range(10):
        gate.check(f"Bearer t{i}", "/metrics")
    assert len(gate._cache) == 3


class _Recorder:
    def __init__(self, status: object) -> None:
        self.status = status
        self.bodies: list[object] = []

    def create_token_review(self, body: object, **_: object) -> object:
        self.bodies.append(body)
        return type("R", (), {"status": self.status})()

    def create_subject_access_review(self, body: object, **_: object) -> object:
        self.bodies.append(body)
        return type("R", (), {"status": self.status})()


def test_kube_reviewer_asks_tokenreview_then_a_non_resource_subjectaccessreview() -> None:
    from kubernetes import client

    reviewer = KubeReviewer(client.ApiClient())
    user = client.V1UserInfo(username=OPERATOR, uid="u1", groups=["system:serviceaccounts"], extra=None)
    reviewer._authn = _Recorder(client.V1TokenReviewStatus(authenticated=True, user=user))  # type: ignore[assignment]
    reviewer._authz = _Recorder(client.V1SubjectAccessReviewStatus(allowed=True))  # type: ignore[assignment]
    who = reviewer.authenticate("tok")
    assert who == UserInfo(OPERATOR, "u1", ("system:serviceaccounts",))
    assert reviewer.authorize(who, "/snapshot", "get") is True
    (sar,) = reviewer._authz.bodies  # type: ignore[attr-defined]
    assert sar.spec.user == OPERATOR
    assert sar.spec.non_resource_attributes.path == "/snapshot"
    assert sar.spec.non_resource_attributes.verb == "get"
    assert sar.spec.resource_attributes is None
    reviewer._authn = _Recorder(client.V1TokenReviewStatus(authenticated=False))  # type: ignore[assignment]
    assert reviewer.authenticate("tok") is None


def test_kube_reviewer_turns_api_failures_into_review_errors() -> None:
    from kubernetes import client

    class Broken:
        def create_token_review(self, *_: object, **__: object) -> object:
            raise OSError("connection refused")

    reviewer = KubeReviewer(client.ApiClient())
    reviewer._authn = Broken()  # type: ignore[assignment]
    with pytest.raises(ReviewError, match="TokenReview"):
        reviewer.authenticate("tok")
