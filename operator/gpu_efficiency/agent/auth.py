"""Optional bearer-token authentication of the agent's data endpoints, the way kube-rbac-proxy does it.

A caller sends its service-account token; the agent asks the API server who it is (TokenReview) and
whether that identity may ``get`` the endpoint's non-resource URL (SubjectAccessReview, e.g. ``/snapshot``).
RBAC then decides who reads the agent: the chart grants ``get`` on ``/metrics`` and ``/snapshot`` to the
operator's service account and to the subjects an admin names (Prometheus).

``Reviewer`` is the seam: ``KubeReviewer`` talks to the API server, tests pass a fake. Decisions are
cached for a short time so a scrape every few seconds costs the API server one review a minute per caller.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


class ReviewError(Exception):
    """The API server could not answer a review (network, 5xx): the request is refused, not let through."""


class Reviewer(Protocol):
    def authenticate(self, token: str) -> UserInfo | None:
        """The token's identity, or None when the API server says the token is not valid."""

    def authorize(self, user: UserInfo, path: str, verb: str) -> bool:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``."""


class Decision(Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403
    UNAVAILABLE = 503


class Gate:
    """Checks the ``Authorization`` header of a request for ``path``; caches decisions for ``ttl_s``.

    Only decisions are cached, never errors: an API server outage refuses requests until it is back.
    """

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        ttl_s: float = 60.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._cache: OrderedDict[tuple[bytes, str], tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Decision.UNAUTHENTICATED
        key = (hashlib.sha256(token.encode()).digest(), path)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        try:
            user = self._reviewer.authenticate(token)
            if user is None:
                decision = Decision.UNAUTHENTICATED
            elif self._reviewer.authorize(user, path, verb):
                decision = Decision.ALLOWED
            else:
                decision = Decision.FORBIDDEN
        except ReviewError as exc:
            log.warning("authentication unavailable: %s", exc)
            return Decision.UNAVAILABLE
        with self._lock:
            self._cache[key] = (now + self._ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return decision


class KubeReviewer:
    """TokenReview and SubjectAccessReview through the in-cluster API (``system:auth-delegator`` grants both)."""

    def __init__(self, api_client: Any, audiences: Sequence[str] = ()) -> None:
        from kubernetes import client

        self._client = client
        self._authn = client.AuthenticationV1Api(api_client)
        self._authz = client.AuthorizationV1Api(api_client)
        self._audiences = list(audiences) or None

    def authenticate(self, token: str) -> UserInfo | None:
        c = self._client
        body = c.V1TokenReview(spec=c.V1TokenReviewSpec(token=token, audiences=self._audiences))
        try:
            status = self._authn.create_token_review(body, _request_timeout=5).status
        except Exception as exc:
            raise ReviewError(f"TokenReview: {exc}") from exc
        if status is None or not status.authenticated or status.user is None:
            return None
        u = status.user
        return UserInfo(
            username=u.username or "",
            uid=u.uid or "",
            groups=tuple(u.groups or ()),
            extra=tuple(sorted((k, tuple(v)) for k, v in (u.extra or {}).items())),
        )

    def authorize(self, user: UserInfo, path: str, verb: str) -> bool:
        c = self._client
        body = c.V1SubjectAccessReview(
            spec=c.V1SubjectAccessReviewSpec(
                user=user.username,
                uid=user.uid or None,
                groups=list(user.groups),
                extra={k: list(v) for k, v in user.extra} or None,
                non_resource_attributes=c.V1NonResourceAttributes(path=path, verb=verb),
            )
        )
        try:
            status = self._authz.create_subject_access_review(body, _request_timeout=5).status
        except Exception as exc:
            raise ReviewError(f"SubjectAccessReview: {exc}") from exc
        return bool(status is not None and status.allowed and not status.denied)


def in_cluster_reviewer() -> KubeReviewer:
    from kubernetes import client
    from kubernetes import config as kube_config

    kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    return KubeReviewer(client.ApiClient())
