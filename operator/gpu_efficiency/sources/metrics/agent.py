"""Node-agent source: read every agent's ``/snapshot`` concurrently and turn it into ``GPUSample``s.

The agents aggregate their own rolling history (``?stats=activity=600,...``), so one request per node
returns a few numbers per signal and window, whatever the sample rate. Endpoints come from a list of
URLs or from the agent pods (label ``app.kubernetes.io/component=node-agent``) listed by a function the
caller supplies, so this module does no Kubernetes I/O of its own.

Safety: an agent that cannot be reached, times out or answers garbage contributes no samples for its
node, and the engine then says Unknown for those GPUs: never idle. ``merge_samples`` combines agent
and Prometheus samples per GPU, keeping the better one whole and saying which in ``GPUSample.source``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gpu_efficiency.engine.model import GPUSample, PodRef, Signal, Stats, Window
from gpu_efficiency.sources.metrics.base import FetchRequest, FetchResult, SourceUnavailable
from gpu_efficiency.sources.metrics.deadline import deadline, httpx_socket

log = logging.getLogger(__name__)

AGENT_POD_SELECTOR = "app.kubernetes.io/component=node-agent"
AGENT_PORT = 9400
SNAPSHOT_SCHEMA = "gpuefficiency.io/agent-snapshot/v1"
_SIGNALS = {s.value: s for s in Signal}


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    url: str  # base URL, e.g. http://10.0.0.7:9400
    node: str | None = None  # known from discovery; else learnt from the snapshot


Discover = Callable[[], Sequence[AgentEndpoint]]


def static_endpoints(urls: Iterable[str]) -> Discover:
    fixed = [AgentEndpoint(u.rstrip("/")) for u in urls]
    return lambda: fixed


def endpoints_from_pods(pods: Iterable[Mapping[str, Any]], port: int = AGENT_PORT) -> list[AgentEndpoint]:
    """Running, ready agent pods (Kubernetes JSON, camelCase) -> endpoints; others are skipped."""
    out: list[AgentEndpoint] = []
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        ip, node = status.get("podIP"), spec.get("nodeName")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        if ip and node and status.get("phase") == "Running" and ready:
            host = f"[{ip}]" if ":" in ip else ip
            out.append(AgentEndpoint(f"http://{host}:{port}", node))
    return out


def pod_endpoints(
    list_pods: Callable[[str, str], Iterable[Mapping[str, Any]]], namespace: str, port: int = AGENT_PORT
) -> Discover:
    """Discovery through ``list_pods(namespace, label_selector)``, e.g. a wrapper of list_namespaced_pod."""
    return lambda: endpoints_from_pods(list_pods(namespace, AGENT_POD_SELECTOR), port)


def _stats(doc: Mapping[str, Any], offset: float) -> Stats:
    return Stats(
        avg=float(doc["avg"]),
        max=float(doc["max"]),
        min=float(doc["min"]),
        last=float(doc["last"]),
        count=int(doc["count"]),
        last_timestamp=float(doc["last_timestamp"]) + offset,
        stddev=float(doc.get("stddev") or 0.0),
        changes=int(doc.get("changes") or 0),
        resets=int(doc.get("resets") or 0),
        first=None if doc.get("first") is None else float(doc["first"]),
    )


def samples_from_snapshot(
    snap: Any,
    windows: Mapping[Window, float],
    *,
    offset: float = 0.0,
    uid_resolver: Callable[[str], PodRef | None] | None = None,
) -> list[GPUSample]:
    """GPUSamples from one agent snapshot taken with ``?stats=`` for ``windows`` (their lengths set the
    expected sample counts). ``offset`` (seconds) moves agent timestamps onto our clock.

    MIG devices are keyed ``<parent UUID>/<GPU instance>`` like the Prometheus source keys them.
    Raises SourceUnavailable, and nothing else, for anything that is not a well-formed snapshot (a
    wrong JSON shape, a zero or negative ``interval_seconds``): that agent's node then reads as
    having no data, never as idle.
    """
    if not isinstance(snap, Mapping) or snap.get("schema") != SNAPSHOT_SCHEMA:
        found = snap.get("schema") if isinstance(snap, Mapping) else type(snap).__name__
        raise SourceUnavailable(f"not an agent snapshot (schema {found!r})")
    try:
        return _samples(snap, windows, offset, uid_resolver)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
        raise SourceUnavailable(f"malformed agent snapshot: {type(exc).__name__}: {exc}") from exc


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not a string")
    return value


def _samples(
    snap: Mapping[str, Any],
    windows: Mapping[Window, float],
    offset: float,
    uid_resolver: Callable[[str], PodRef | None] | None,
) -> list[GPUSample]:
    node, interval = _text(snap["node"], "node"), float(snap["interval_seconds"])
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"interval_seconds {interval} is not a positive number")
    by_name = {w.value: w for w in Window}
    expected = {w: seconds / interval for w, seconds in windows.items()}
    out: list[GPUSample] = []
    for gpu in snap["gpus"]:
        by_window: dict[Window, dict[Signal, Stats]] = {}
        for name, signals in (gpu.get("stats") or {}).items():
            if name in by_name:
                by_window[by_name[name]] = {
                    _SIGNALS[sig]: _stats(s, offset) for sig, s in signals.items() if sig in _SIGNALS
                }
        mig = gpu.get("mig")
        uuid = (
            f"{_text(mig['parent_uuid'], 'parent_uuid')}/{mig['gpu_instance_id']}"
            if mig
            else _text(gpu["uuid"], "uuid")
        )
        pods: list[PodRef] = []
        for p in gpu.get("pods") or ():
            ref = (
                PodRef(
                    _text(p["namespace"], "namespace"),
                    _text(p["name"], "name"),
                    _text(p.get("container", ""), "container"),
                )
                if p.get("name")
                else None
            )
            if ref is None and p.get("uid") and uid_resolver is not None:
                ref = uid_resolver(_text(p["uid"], "uid"))
            if ref is not None and ref not in pods:
                pods.append(ref)
        fb_total = (gpu.get("fields") or {}).get("fb_total_mib")
        out.append(
            GPUSample(
                node=node,
                uuid=uuid,
                index=str(gpu["index"]).split("/", 1)[0],
                model=str(gpu.get("model") or gpu.get("name", "")),
                pods=tuple(sorted(pods, key=lambda r: (r.namespace, r.name, r.container))),
                stats=by_window,
                source="agent",
                expected_samples=expected,
                fb_total_mib=None if fb_total is None else float(fb_total),
            )
        )
    return out


class AgentSource:
    """A SampleSource over the node agents (see module docstring)."""

    def __init__(
        self,
        discover: Discover | Sequence[str],
        *,
        timeout_s: float = 3.0,
        concurrency: int = 16,
        uid_resolver: Callable[[str], PodRef | None] | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        token_file: str | None = None,
    ) -> None:
        """``token_file``: a bearer token sent to every agent (agents started with ``--auth tokenreview``);
        read again at every fetch because the kubelet rotates projected service-account tokens."""
        self._token_file = token_file
        self._discover = static_endpoints(discover) if isinstance(discover, Sequence) else discover
        self._concurrency = max(1, concurrency)
        self._uid_resolver = uid_resolver
        self._clock = clock
        self._timeout_s = timeout_s
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=self._concurrency, max_keepalive_connections=self._concurrency
            ),
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def fetch(self, request: FetchRequest, nodes: Collection[str] | None = None) -> FetchResult:
        """Samples from every agent (or those on ``nodes``). Raises SourceUnavailable when discovery fails
        or no agent answers; a partial answer lists the failed agents in ``warnings``."""
        started = time.monotonic()
        try:
            endpoints = list(self._discover())
        except Exception as exc:
            raise SourceUnavailable(f"node-agent discovery failed: {exc}") from exc
        if nodes is not None:
            wanted = set(nodes)
            endpoints = [e for e in endpoints if e.node is None or e.node in wanted]
        if not endpoints:
            return FetchResult(gpus=(), warnings=("no node agents found",))
        headers = self._auth_headers()
        query = "history=0&stats=" + ",".join(f"{w.value}={s:g}" for w, s in request.windows.items())
        with ThreadPoolExecutor(max_workers=min(self._concurrency, len(endpoints))) as pool:
            answers = list(pool.map(lambda e: self._one(e, query, request.windows, headers), endpoints))
        gpus: list[GPUSample] = []
        warnings: list[str] = []
        for endpoint, (samples, error) in zip(endpoints, answers, strict=True):
            if error:
                warnings.append(f"agent {endpoint.node or endpoint.url}: {error}")
            gpus.extend(s for s in samples if nodes is None or s.node in nodes)
        if len(warnings) == len(endpoints):
            raise SourceUnavailable("no node agent answered: " + "; ".join(warnings))
        gpus.sort(key=lambda g: (g.node, g.index, g.uuid))
        return FetchResult(
            gpus=tuple(gpus),
            queries=len(endpoints),
            seconds=time.monotonic() - started,
            warnings=tuple(warnings),
        )

    def fetch_samples(
        self, nodes: Collection[str] | None, window_seconds: float, now: float
    ) -> list[GPUSample]:
        """Shorthand: activity and fault windows of the same length."""
        windows = {Window.ACTIVITY: window_seconds, Window.FAULT: window_seconds}
        try:
            result = self.fetch(FetchRequest(now=now, windows=windows, scrape_interval=0.0), nodes)
        except SourceUnavailable:
            return []
        return list(result.gpus)

    def _get(self, url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """GET ``url`` by the wall-clock deadline ``timeout_s``, body included (a trickled body
        must not hold the fetch: see ``sources/metrics/deadline.py``)."""
        with deadline(self._timeout_s) as limit:
            try:
                with self._client.stream("GET", url, headers=headers, timeout=limit.remaining()) as response:
                    limit.hold(httpx_socket(response))
                    return response.status_code, response.read()
            except httpx.HTTPError as exc:
                if limit.expired or time.monotonic() >= limit.end:
                    raise httpx.TimeoutException(f"no answer within {limit.seconds:g}s") from exc
                raise

    def _auth_headers(self) -> dict[str, str]:
        if self._token_file is None:
            return {}
        try:
            with open(self._token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise SourceUnavailable(f"node-agent token file: {exc}") from exc
        if not token:
            raise SourceUnavailable(f"node-agent token file {self._token_file} is empty")
        return {"Authorization": f"Bearer {token}"}

    def _one(
        self, endpoint: AgentEndpoint, query: str, windows: Mapping[Window, float], headers: Mapping[str, str]
    ) -> tuple[list[GPUSample], str]:
        try:
            status, content = self._get(f"{endpoint.url}/snapshot?{query}", headers)
            received = self._clock()
            if status != 200:
                return [], f"HTTP {status}"
            snap = orjson.loads(content)
            if not isinstance(snap, dict):
                return [], f"answered {type(snap).__name__}, not a snapshot object"
            if endpoint.node is not None and snap.get("node") != endpoint.node:
                return [], f"answers for node {snap.get('node')!r}, expected {endpoint.node!r}"
            offset = received - float(snap["timestamp"])
            samples = samples_from_snapshot(snap, windows, offset=offset, uid_resolver=self._uid_resolver)
        except SourceUnavailable as exc:
            return [], str(exc)
        except (
            httpx.HTTPError,
            orjson.JSONDecodeError,
            KeyError,
            TypeError,
            ValueError,
            OverflowError,
        ) as exc:
            return [], f"{type(exc).__name__}: {exc}"
        if not snap.get("ready", False):
            return samples, f"not ready ({snap.get('reason', '')}); its samples may be stale"
        return samples, ""
