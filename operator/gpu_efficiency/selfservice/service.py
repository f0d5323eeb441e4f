"""The page's routes and their start-up (I/O): GET /gpu?t=TOKEN shows the page, POST /gpu/keep and
POST /gpu/release apply a click (clicks.py). Every route verifies the token first; a refused one
gets a plain error page and nothing is read or written beyond that.

``start_selfservice(config, runner)`` builds the server, the Clicker and the routes and starts the
server; the returned ``SelfService`` holds ``server`` (``register_post`` more routes, e.g. Slack's),
``clicker`` and ``key``. It runs in every replica: GETs are answered by leader and standby alike,
clicks are written only by the leader (a standby answers "try again").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gpu_efficiency.actuators.events import EventRecorder
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION, GPUEfficiencyPolicySpec
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.selfservice.clicks import Click, Clicker, Keep, Release
from gpu_efficiency.selfservice.evidence import Evidence, read_evidence
from gpu_efficiency.selfservice.page import KEEP_PATH, RELEASE_PATH, PageFacts, error_page, page, result_page
from gpu_efficiency.selfservice.rules import keep_choices
from gpu_efficiency.selfservice.server import Reply, SelfServiceServer
from gpu_efficiency.selfservice.tokens import PAGE_PATH, Claims, TokenError, check_key, link, verify
from gpu_efficiency.sources.metrics.base import SampleSource

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
EvidenceReader = Callable[[str, GPUEfficiencyPolicySpec, str, str, float], Evidence]


def read_key(path: str) -> bytes:
    """The signing key from the mounted Secret's file; RuntimeError saying what to fix."""
    try:
        return check_key(Path(path).read_bytes())
    except OSError as exc:
        raise RuntimeError(f"self-service is enabled but its key file {path} is unreadable: {exc}") from None
    except ValueError as exc:
        raise RuntimeError(f"self-service key file {path}: {exc}") from None


def _html(status: int, text: str) -> Reply:
    return status, HTML, text.encode()


def _refused(exc: TokenError) -> Reply:
    return _html(403, error_page("This link cannot be used", str(exc)))


@dataclass
class SelfService:
    server: SelfServiceServer
    clicker: Clicker
    key: bytes


class Pages:
    """The three routes (see the module docstring)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        clicker: Clicker,
        key: bytes,
        evidence: EvidenceReader,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.clicker, self.key, self.evidence, self.clock = clicker, key, evidence, clock

    def show(self, headers: Mapping[str, str], query: str, remote: str) -> Reply:
        token = (parse_qs(query).get("t") or [""])[0]
        try:
            claims = verify(self.key, token, self.clock())
        except TokenError as exc:
            return _refused(exc)
        try:
            pod: Any = self.core.read_namespaced_pod(claims.pod, claims.namespace)
            raw: Any = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, claims.policy)
            spec = GPUEfficiencyPolicySpec.model_validate(raw.get("spec") or {})
        except ApiException as exc:
            if exc.status == 404:
                return _html(410, error_page("Gone", "the pod or its policy no longer exists"))
            return _html(503, error_page("Try again", f"the Kubernetes API answered HTTP {exc.status}"))
        except ValidationError:
            return _html(503, error_page("Try again", f"the policy {claims.policy} is unreadable now"))
        meta = pod.metadata
        if meta.uid != claims.uid:
            return _html(
                410, error_page("Gone", "the pod this link was made for no longer exists (it was replaced)")
            )
        owner = next((r for r in meta.owner_references or [] if r.controller), None)
        window_s = spec.window.seconds
        now = self.clock()
        evidence = self.evidence(claims.policy, spec, claims.namespace, claims.pod, now)
        max_keep_s = spec.idle.max_keep.seconds
        facts = PageFacts(
            claims=claims,
            token=token,
            now=now,
            annotations=dict(meta.annotations or {}),
            owner_kind=owner.kind if owner is not None else "",
            owner_name=owner.name if owner is not None else "",
            keep_choices=keep_choices(spec.idle.allow_keep_until, max_keep_s),
            max_keep_s=max_keep_s,
            activity_below=spec.idle.activity_below,
            window_s=window_s,
            step_s=evidence.step_s,
            series=evidence.series,
            memory=evidence.memory,
            evidence_error=evidence.error,
        )
        return _html(200, page(facts))

    def keep(self, headers: Mapping[str, str], body: bytes, remote: str) -> Reply:
        return self._click(body, remote, lambda form: Keep((form.get("duration") or [""])[0]))

    def release(self, headers: Mapping[str, str], body: bytes, remote: str) -> Reply:
        return self._click(body, remote, lambda _: Release())

    def _click(self, body: bytes, remote: str, make: Callable[[dict[str, list[str]]], Click]) -> Reply:
        try:
            form = parse_qs(body.decode("ascii"), strict_parsing=True, max_num_fields=4)
        except (UnicodeDecodeError, ValueError):
            return _html(400, error_page("Bad request", "the form could not be read"))
        token = (form.get("t") or [""])[0]
        try:
            claims = verify(self.key, token, self.clock())
        except TokenError as exc:
            return _refused(exc)
        outcome = self.clicker.apply(claims, make(form), remote=remote, via="page")
        back = link("", token)
        return _html(outcome.status, result_page(outcome.status == 200, outcome.message, back))


def start_selfservice(
    config: OperatorConfig,
    api_client: client.ApiClient,
    is_leader: Callable[[], bool],
    source_for: Callable[[str, GPUEfficiencyPolicySpec], SampleSource],
) -> SelfService:
    """Build and start the server with the page's routes (config.selfservice_port must be > 0)."""
    key = read_key(config.selfservice_key_file)
    clicker = Clicker(api_client, EventRecorder(api_client, instance=config.identity), is_leader=is_leader)

    def evidence(
        policy: str, spec: GPUEfficiencyPolicySpec, namespace: str, pod: str, now: float
    ) -> Evidence:
        return read_evidence(
            source_for(policy, spec),
            namespace=namespace,
            pod=pod,
            window_s=spec.window.seconds,
            now=now,
            matchers=config.prometheus_matchers,
        )

    pages = Pages(api_client, clicker, key, evidence)
    server = SelfServiceServer(config.selfservice_port)
    server.register_get(PAGE_PATH, pages.show)
    server.register_post(KEEP_PATH, pages.keep)
    server.register_post(RELEASE_PATH, pages.release)
    server.start()
    return SelfService(server, clicker, key)


__all__ = ["Claims", "Pages", "SelfService", "read_key", "start_selfservice"]
