"""Apply one Keep for or Release now click to a pod: the one place that writes them, for the page
(server.py) and for Slack's interactive buttons alike.

Interface (stable; Slack's handler calls it too)::

    clicker = Clicker(api_client, recorder, is_leader=runner.leader.is_leader)
    outcome = clicker.apply(claims, Keep("2h"), remote="10.0.0.7", via="page")   # or Release()
    outcome.status   # 200 done or unchanged, 403 refused by the policy, 409 not this pod's warning,
                     # 410 pod or policy gone, 503 standby/API trouble: try again
    outcome.changed  # True only for the click that wrote (a replay, a second tab: False)
    outcome.message  # plain words for the person who clicked

``claims`` come from a verified token (tokens.verify). Safety: only the leader writes (a standby
answers 503 "try again"); the pod is re-read and must still have the token's uid and policy; the
duration is re-checked against the policy read now (rules.keep_refusal); the patch carries the
pod's resourceVersion, so two clicks racing give one write and the loser re-reads and sees it done
(idempotent); the write that changed something is recorded as an event on the pod naming the click
and the remote address, and every click is counted (gpu_efficiency_selfservice_clicks).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_efficiency import metrics
from gpu_efficiency.actuators.events import EventRecorder, pod_ref
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION, GPUEfficiencyPolicySpec
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.selfservice.rules import keep_refusal
from gpu_efficiency.selfservice.tokens import Claims

log = logging.getLogger(__name__)

#: Optimistic-concurrency retries of one click (each re-reads the pod).
WRITE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Keep:
    duration: str  # one of rules.keep_choices(...), e.g. "2h"


@dataclass(frozen=True, slots=True)
class Release:
    pass


Click = Keep | Release


@dataclass(frozen=True, slots=True)
class ClickOutcome:
    status: int
    changed: bool
    message: str

    @property
    def result(self) -> str:
        """The metric's result label."""
        if self.status == 200:
            return "done" if self.changed else "unchanged"
        return {503: "standby", 500: "failed"}.get(self.status, "refused")


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    allow_keep_until: bool
    max_keep_s: float


def _limits(raw: Mapping[str, Any]) -> PolicyLimits:
    spec = GPUEfficiencyPolicySpec.model_validate(raw.get("spec") or {})
    return PolicyLimits(spec.idle.allow_keep_until, spec.idle.max_keep.seconds)


class Clicker:
    """Writes clicks (see the module docstring); built once, shared by the page and Slack."""

    def __init__(
        self,
        api_client: client.ApiClient,
        recorder: EventRecorder,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.recorder = recorder
        self.is_leader = is_leader
        self.clock = clock

    def policy_limits(self, policy: str) -> PolicyLimits | None:
        """The policy's keep rules, read now; None when the policy is gone or unreadable."""
        try:
            raw: Any = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
            return _limits(raw)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        except ValidationError:
            return None

    def apply(self, claims: Claims, click: Click, *, remote: str, via: str) -> ClickOutcome:
        action = "keep" if isinstance(click, Keep) else "release"
        try:
            outcome = self._apply(claims, click, remote=remote, via=via)
        except ApiException as exc:
            log.warning(
                "self-service %s of %s/%s failed: HTTP %s", action, claims.namespace, claims.pod, exc.status
            )
            outcome = ClickOutcome(503, False, f"the Kubernetes API answered HTTP {exc.status}: try again")
        except Exception:  # the page must answer; the click is not applied
            log.exception("self-service %s of %s/%s failed", action, claims.namespace, claims.pod)
            outcome = ClickOutcome(500, False, "an internal error stopped the click: nothing was changed")
        metrics.SELF_SERVICE_CLICKS.labels(action, via, outcome.result).inc()
        return outcome

    def _apply(self, claims: Claims, click: Click, *, remote: str, via: str) -> ClickOutcome:
        if not self.is_leader():
            return ClickOutcome(503, False, "this replica is on standby: try again in a few seconds")
        limits = self.policy_limits(claims.policy)
        if limits is None:
            return ClickOutcome(410, False, f"the policy {claims.policy} is gone: nothing to answer")
        if isinstance(click, Keep):
            refusal = keep_refusal(click.duration, limits.allow_keep_until, limits.max_keep_s)
            if refusal:
                return ClickOutcome(403, False, refusal)
        for _ in range(WRITE_ATTEMPTS):
            try:
                pod = self.core.read_namespaced_pod(claims.pod, claims.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return ClickOutcome(410, False, f"the pod {claims.namespace}/{claims.pod} is gone")
                raise
            meta = pod.metadata or client.V1ObjectMeta()
            if meta.uid != claims.uid or meta.deletion_timestamp is not None:
                return ClickOutcome(410, False, f"the pod {claims.namespace}/{claims.pod} is gone (replaced)")
            ann: dict[str, str] = dict(meta.annotations or {})
            if ann.get(names.POLICY) != claims.policy:
                return ClickOutcome(409, False, f"the pod is no longer judged by the policy {claims.policy}")
            patch, done, told = _patch_for(click, ann, self.clock())
            if not patch:
                return ClickOutcome(200, False, done)
            body = {"metadata": {"resourceVersion": meta.resource_version, "annotations": patch}}
            try:
                self.core.patch_namespaced_pod(claims.pod, claims.namespace, body)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # another click (or the operator) wrote first: re-read and judge again
                if exc.status == 404:
                    return ClickOutcome(410, False, f"the pod {claims.namespace}/{claims.pod} is gone")
                raise
            reason = names.EV_KEEP_CLICKED if isinstance(click, Keep) else names.EV_RELEASE_CLICKED
            where = "the self-service page" if via == "page" else via
            try:
                self.recorder.record(
                    pod_ref(claims.namespace, claims.pod, claims.uid),
                    reason,
                    f"{told} by a click on {where} from {remote}",
                )
            except ApiException as exc:  # the click is written; the event is the record, not the effect
                log.warning(
                    "event %s on %s/%s not recorded: HTTP %s",
                    reason,
                    claims.namespace,
                    claims.pod,
                    exc.status,
                )
            return ClickOutcome(200, True, done)
        return ClickOutcome(503, False, "the pod kept changing while the click was written: try again")


def _patch_for(click: Click, ann: Mapping[str, str], now: float) -> tuple[dict[str, str | None], str, str]:
    """(patch, what the person is told, what the event says); an empty patch: already so."""
    if isinstance(click, Keep):
        told = f"kept for {click.duration} from when the operator sees it (at most the policy's maxKeep)"
        if ann.get(names.KEEP_FOR) == click.duration and names.RELEASE not in ann:
            return {}, f"already {told}", ""
        patch: dict[str, str | None] = {names.KEEP_FOR: click.duration}
        if names.RELEASE in ann:
            patch[names.RELEASE] = None
        return patch, f"GPU {told}", f"{names.KEEP_FOR}={click.duration} set"
    if names.RELEASE in ann:
        return {}, "already released: the GPU is reclaimed at the operator's next cycle", ""
    patch = {names.RELEASE: format_rfc3339(now)}
    for key in names.ACKNOWLEDGEMENTS:
        if key in ann:
            patch[key] = None
    return (
        patch,
        "released: the GPU is reclaimed at the operator's next cycle",
        f"{names.RELEASE} set (GPU given back; any keep-for/keep-until removed)",
    )


__all__ = ["Click", "ClickOutcome", "Clicker", "Keep", "PolicyLimits", "Release"]
