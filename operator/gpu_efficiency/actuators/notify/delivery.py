"""Post notifications to the policy's webhooks without ever slowing or failing a cycle.

Each sink gets its own bounded queue and worker thread, so a sink that hangs holds only itself: a
cycle only offers to the queue (``put_nowait``), and a full queue drops and counts. The worker
waits out the sink's rate limit, posts with a per-request timeout and retries failures with
exponential backoff (bounded attempts; a 4xx other than 408/429 is not retried). Each warning is
offered once (same object, reason and deadline), so a re-planned action never posts twice.

The webhook URL is a secret (a Slack webhook URL is its own credential): it is read at each post
from the file the chart mounts from one Secret (``--notify-secret-dir``; the operator has no Secret
read rights), never logged, and scrubbed from error messages. Only http(s) URLs are posted to, and
redirects are not followed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson

from gpu_efficiency import metrics
from gpu_efficiency.actuators.notify.wire import CLOUDEVENTS_CONTENT_TYPE, cloudevent, slack_message
from gpu_efficiency.api.names import SLACK_URL_SECRET_KEY
from gpu_efficiency.api.policy import NotifySink, SinkType
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine import Notification
from gpu_efficiency.slackapp.buttons import token_of, with_buttons

log = logging.getLogger(__name__)

#: Where the chart mounts the notify Secret (values: notify.secretName).
DEFAULT_SECRET_DIR = "/etc/gpu-efficiency/notify"
RESULTS = ("sent", "failed", "dropped", "retried")

#: (url, body, content type, timeout seconds) -> HTTP status; raises on a transport failure.
Post = Callable[[str, bytes, str, float], int]


def http_post(url: str, body: bytes, content_type: str, timeout: float) -> int:
    """One POST with httpx (no redirects: a webhook that moves is a failure, not a new target)."""
    response = httpx.post(
        url,
        content=body,
        headers={"Content-Type": content_type, "User-Agent": "gpu-efficiency-operator"},
        timeout=timeout,
        follow_redirects=False,
    )
    return response.status_code


class DeliveryError(Exception):
    """A delivery that failed; ``retry``: worth another attempt (timeouts, 5xx, 429)."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True, slots=True)
class Delivery:
    reason: str
    body: bytes
    content_type: str
    namespace: str = ""
    url_key: str = ""  # the namespace's own webhook (a Secret key); "": the sink's urlSecretKey


@dataclass(frozen=True, slots=True)
class Health:
    """The last delivery of one sink: ``error`` is '' when it succeeded."""

    error: str
    at: float


def encode(
    sink: NotifySink, notification: Notification, keep_choices: Sequence[str] | None = None
) -> Delivery:
    """The request body of one notification in the sink's format. ``keep_choices``: the Slack app is
    configured, so a warning with a self-service link gets its Keep for (these) / Release now buttons."""
    if sink.type is SinkType.SLACK:
        message = slack_message(notification)
        if keep_choices is not None and notification.link:
            message = with_buttons(message, token_of(notification.link), keep_choices)
        body = orjson.dumps(message)
        return Delivery(
            notification.reason, body, "application/json", notification.namespace, notification.slack_url_key
        )
    return Delivery(notification.reason, orjson.dumps(cloudevent(notification)), CLOUDEVENTS_CONTENT_TYPE)


@dataclass(frozen=True, slots=True)
class Timing:
    """Retry, rate and timeout settings (tests shorten them)."""

    attempts: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    timeout_s: float = 5.0
    queue_size: int = 100


class SinkWorker:
    """One sink's queue and thread."""

    def __init__(self, policy: str, sink: NotifySink, notifier: Notifier) -> None:
        self.policy, self.sink, self.notifier = policy, sink, notifier
        self.queue: queue.Queue[Delivery | None] = queue.Queue(maxsize=notifier.timing.queue_size)
        self._next_post = 0.0
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"notify-{policy}-{sink.name}", daemon=True)
        self.thread.start()

    def offer(self, delivery: Delivery) -> bool:
        try:
            self.queue.put_nowait(delivery)
        except queue.Full:
            return False
        return True

    def stop(self) -> None:
        """End the thread after its current delivery; what is still queued is dropped."""
        self._stopped.set()
        with contextlib.suppress(queue.Full):  # full: the thread sees the flag after its delivery
            self.queue.put_nowait(None)

    def _run(self) -> None:
        while not self._stopped.is_set():
            delivery = self.queue.get()
            if delivery is None or self._stopped.is_set():
                return
            try:
                self._deliver(delivery)
            except Exception:  # a bug here must not end the worker
                log.exception("notification sink %s/%s: delivery failed", self.policy, self.sink.name)

    def _wait_for_rate(self) -> None:
        n = self.notifier
        wait = self._next_post - n.monotonic()
        if wait > 0:
            n.sleep(wait)
        self._next_post = max(self._next_post, n.monotonic()) + 60.0 / self.sink.max_per_minute

    def _deliver(self, delivery: Delivery) -> None:
        n, timing = self.notifier, self.notifier.timing
        error = ""
        for attempt in range(1, timing.attempts + 1):
            self._wait_for_rate()
            try:
                n.post_once(self.sink, delivery, self.policy)
            except DeliveryError as exc:
                error = str(exc)
                if not exc.retry or attempt == timing.attempts:
                    break
                n.count(self.policy, self.sink.name, "retried")
                n.sleep(min(timing.backoff_max_s, timing.backoff_s * 2 ** (attempt - 1)))
                continue
            n.count(self.policy, self.sink.name, "sent")
            n.record(self.policy, self.sink.name, "")
            return
        attempts = f"{attempt} attempt{'s' if attempt > 1 else ''}"
        message = f"{delivery.reason} not delivered after {attempts}: {error}"
        log.warning("notification sink %s/%s: %s", self.policy, self.sink.name, message)
        n.count(self.policy, self.sink.name, "failed")
        n.record(self.policy, self.sink.name, message)


class Notifier:
    """The policies' sinks: offered notifications from cycles, posted by one thread per sink."""

    def __init__(
        self,
        secret_dir: str | Path = DEFAULT_SECRET_DIR,
        *,
        post: Post = http_post,
        timing: Timing | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        remember: int = 10_000,
        slack_buttons: bool = False,
    ) -> None:
        self.secret_dir = Path(secret_dir)
        self.slack_buttons = slack_buttons  # the Slack app's signing secret is configured
        self.post, self.sleep, self.monotonic, self.wall = post, sleep, monotonic, wall
        self.timing = timing or Timing()
        self._remember = remember
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._workers: dict[tuple[str, str], SinkWorker] = {}
        self._health: dict[tuple[str, str], Health] = {}
        #: (policy, sink, namespace) -> why the namespace's own webhook was not used (fell back).
        self._route_errors: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    # -- called by cycles: never blocks ---------------------------------------------------------

    def submit(
        self,
        policy: str,
        sinks: Sequence[NotifySink],
        batch: Sequence[Notification],
        keep_choices: Sequence[str] = (),
    ) -> None:
        """Offer each notification to the sinks that want it; returns at once. ``keep_choices``: the
        Keep for durations the policy allows (Slack buttons, where the Slack app is configured)."""
        buttons = tuple(keep_choices) if self.slack_buttons else None
        self._retire(policy, sinks)
        for sink in sinks:
            metrics_labels = (policy, sink.name)
            for result in RESULTS:  # exported at 0 from the start, so an alert's rate() sees the first
                metrics.NOTIFICATIONS.labels(*metrics_labels, result)
            for notification in batch:
                if not sink.wants(notification.reason, notification.namespace):
                    continue
                key = (policy, sink.name, notification.dedupe_key)
                with self._lock:
                    if key in self._seen:
                        continue
                if self._worker(policy, sink).offer(encode(sink, notification, buttons)):
                    self._mark(key)
                else:
                    self.count(policy, sink.name, "dropped")
                    self.record(policy, sink.name, f"queue full: {notification.reason} dropped")

    def failures(self, policy: str, sinks: Sequence[NotifySink]) -> dict[str, str]:
        """Sink name -> why its last delivery failed (with when), for the sinks failing now."""
        with self._lock:
            health = {s.name: self._health.get((policy, s.name)) for s in sinks}
        return {
            name: f"{h.error} ({format_rfc3339(h.at)})"
            for name, h in health.items()
            if h is not None and h.error
        }

    def misrouted(self, policy: str) -> dict[str, str]:
        """Namespace -> why its own Slack webhook was not used at its last post (it fell back to
        the sink's), until a post to it works or it names none."""
        with self._lock:
            routes = sorted((k, v) for k, v in self._route_errors.items() if k[0] == policy)
        out: dict[str, str] = {}
        for (_, _sink, namespace), error in routes:
            out[namespace] = f"{out[namespace]}; {error}" if namespace in out else error
        return out

    def forget(self, policy: str) -> None:
        """The policy is gone: stop its workers and drop what is kept for it."""
        self._retire(policy, ())

    def stop(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.stop()

    # -- used by the workers --------------------------------------------------------------------

    def url(self, sink: NotifySink, key: str = "") -> str:
        """The webhook URL under ``key`` (default: the sink's) from the mounted Secret (read per
        post: a rotated Secret applies)."""
        key = key or sink.url_secret_key
        path = self.secret_dir / key
        try:
            url = path.read_text().strip()
        except OSError as exc:
            raise DeliveryError(
                f"no webhook URL: cannot read {path} ({exc.strerror}); set notify.secretName in the "
                f"chart to a Secret with the key {key}",
                retry=False,
            ) from None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DeliveryError(
                f"the webhook URL in {path} is not an http(s) URL; nothing was posted", retry=False
            )
        return url

    def route(self, policy: str, sink: NotifySink, delivery: Delivery) -> str:
        """The URL of the namespace's own webhook when it names one that works, else the sink's:
        a warning that reaches the shared channel beats one that reaches nobody. Why the
        namespace's was not used is kept (in ``failures``, so in NotificationsHealthy) until it works."""
        route = (policy, sink.name, delivery.namespace)
        if not delivery.url_key:  # (again) none: what was kept about the namespace's is moot
            with self._lock:
                self._route_errors.pop(route, None)
            return self.url(sink)
        try:
            url = self.url(sink, delivery.url_key)
        except DeliveryError as exc:
            with self._lock:
                self._route_errors[route] = (
                    f"sink {sink.name}: its {SLACK_URL_SECRET_KEY} was not used ({exc}); "
                    "posted to the sink's own webhook"
                )
            return self.url(sink)
        with self._lock:
            self._route_errors.pop(route, None)
        return url

    def post_once(self, sink: NotifySink, delivery: Delivery, policy: str = "") -> None:
        url = self.route(policy, sink, delivery)
        try:
            status = self.post(url, delivery.body, delivery.content_type, self.timing.timeout_s)
        except Exception as exc:
            text = str(exc).replace(url, "<webhook URL>")
            raise DeliveryError(
                f"{type(exc).__name__}: {text}" if text else type(exc).__name__, retry=True
            ) from None
        if 200 <= status < 300:
            return
        raise DeliveryError(f"HTTP {status}", retry=status in (408, 429) or status >= 500)

    def count(self, policy: str, sink: str, result: str) -> None:
        metrics.NOTIFICATIONS.labels(policy, sink, result).inc()

    def record(self, policy: str, sink: str, error: str) -> None:
        with self._lock:
            if (policy, sink) in self._workers:
                self._health[(policy, sink)] = Health(error, self.wall())

    # -- internals ------------------------------------------------------------------------------

    def _mark(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)

    def _worker(self, policy: str, sink: NotifySink) -> SinkWorker:
        with self._lock:
            worker = self._workers.get((policy, sink.name))
            if worker is not None and worker.sink == sink:
                return worker
            old = worker
            worker = self._workers[(policy, sink.name)] = SinkWorker(policy, sink, self)
        if old is not None:
            old.stop()  # the sink was edited: the old worker ends after its current delivery
        return worker

    def _retire(self, policy: str, sinks: Sequence[NotifySink]) -> None:
        """Stop the workers of sinks the policy no longer has."""
        keep = {s.name for s in sinks}
        with self._lock:
            gone = [k for k in self._workers if k[0] == policy and k[1] not in keep]
            workers = [self._workers.pop(k) for k in gone]
            for k in [k for k in self._health if k[0] == policy and k[1] not in keep]:
                del self._health[k]
            for r in [r for r in self._route_errors if r[0] == policy and r[1] not in keep]:
                del self._route_errors[r]
        for worker in workers:
            worker.stop()
