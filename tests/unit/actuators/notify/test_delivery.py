"""The notifier against a real HTTP receiver on 127.0.0.1: CloudEvents and Slack bodies and headers,
one post per warning, retries with exponential backoff (bounded), the rate limit, and a sink that
hangs or fails never slowing a cycle (its failure shows in the metric and the policy condition)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from tests.unit.engine import builders as b
from tests.unit.runtime.cycle_harness import ENFORCE_SPEC, runner, warned_idle_pod

from gpu_efficiency import metrics
from gpu_efficiency.actuators.notify.delivery import Notifier, Timing
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import NotifySink
from gpu_efficiency.engine.notify.messages import Notification


@dataclass
class Receiver:
    """A webhook receiver: answers each POST with the next of ``statuses`` (then 200), after
    ``delay`` seconds, and keeps what it received."""

    statuses: list[int] = field(default_factory=list)
    delay: float = 0.0
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.received) >= count, f"received {len(self.received)} of {count}"


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            if state.delay:
                state.release.wait(state.delay)
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/hook"
    state.release.set()
    server.shutdown()
    server.server_close()


class FakeClock:
    """Sleeps recorded and not waited: the monotonic clock moves by what was slept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def sink(kind: str = "CloudEvents", **fields: object) -> NotifySink:
    return NotifySink.model_validate({"name": "team", "type": kind, "urlSecretKey": "team-url", **fields})


def secrets(tmp_path: Path, url: str) -> Path:
    (tmp_path / "team-url").write_text(url + "\n")
    return tmp_path


WARNING = Notification(
    reason=names.EV_EVICTION_SCHEDULED, type="Warning", policy="p", time=b.NOW, kind="Pod", name="nb-0",
    uid="uid-1", message="this GPU has done no work for 45m: the pod will be evicted after X. To keep it: K",
    namespace="team-a", pod="nb-0", node="node-0", gpus=("GPU-0",), verdict="Idle", diagnosis="idle",
    why="its GPU has done no work for 45m", deadline=b.NOW + 900, acknowledge="K",
)  # fmt: skip


def notifier(tmp_path: Path, url: str, clock: FakeClock | None = None, **timing: float) -> Notifier:
    clock = clock or FakeClock()
    return Notifier(
        secrets(tmp_path, url),
        timing=Timing(**{"attempts": 3, "timeout_s": 2.0, **timing}),  # type: ignore[arg-type]
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )


def count(result: str, policy: str = "p") -> float:
    value = metrics.REGISTRY.get_sample_value(
        "gpu_efficiency_notifications_total", {"policy": policy, "sink": "team", "result": result}
    )
    return value or 0.0


@pytest.fixture(autouse=True)
def fresh_metric() -> Iterator[None]:
    metrics.NOTIFICATIONS.clear()
    yield
    metrics.NOTIFICATIONS.clear()


def settle(n: Notifier, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert check()


def test_a_cloudevent_is_posted_in_structured_mode(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    n = notifier(tmp_path, url)
    n.submit("p", [sink()], [WARNING])
    state.wait_for(1)
    headers, body = state.received[0]
    assert headers["content-type"] == "application/cloudevents+json; charset=utf-8"
    event = orjson.loads(body)
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.gpuefficiency.GPUIdleEvictionScheduled"
    assert event["subject"] == "namespaces/team-a/pods/nb-0"
    assert event["data"]["deadline"] is not None
    assert event["data"]["acknowledge"] == "K"
    settle(n, lambda: count("sent") == 1)
    n.stop()


def test_a_slack_sink_gets_block_kit_json(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    n = notifier(tmp_path, url)
    n.submit("p", [sink("Slack")], [replace(WARNING, channel="#team-a")])
    state.wait_for(1)
    headers, body = state.received[0]
    assert headers["content-type"] == "application/json"
    message = orjson.loads(body)
    assert message["channel"] == "#team-a"
    assert message["text"].endswith("To keep it: K")
    assert [block["type"] for block in message["blocks"]] == ["header", "section", "section", "context"]
    n.stop()


def test_each_warning_is_posted_once(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    n = notifier(tmp_path, url)
    later = replace(WARNING, time=WARNING.time + 60)  # the same warning, planned again
    other = replace(WARNING, deadline=(WARNING.deadline or 0) + 3600)  # a new warning of the same pod
    for batch in ([WARNING], [WARNING, later], [other]):
        n.submit("p", [sink()], batch)
    state.wait_for(2)
    time.sleep(0.2)
    assert len(state.received) == 2
    n.stop()


def test_failures_are_retried_with_exponential_backoff(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    state.statuses = [500, 503]
    clock = FakeClock()
    n = notifier(tmp_path, url, clock, backoff_s=1.0)
    n.submit("p", [sink(maxPerMinute=600)], [WARNING])  # 0.1 s apart: the backoff is longer
    state.wait_for(3)
    settle(n, lambda: count("sent") == 1)
    assert clock.slept == [1.0, 2.0]
    assert count("retried") == 2
    assert n.failures("p", [sink()]) == {}
    n.stop()


def test_attempts_are_bounded_and_the_failure_is_reported(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    state.statuses = [500] * 10
    n = notifier(tmp_path, url)
    n.submit("p", [sink()], [WARNING])
    settle(n, lambda: count("failed") == 1)
    assert len(state.received) == 3
    (why,) = n.failures("p", [sink()]).values()
    assert why.startswith("GPUIdleEvictionScheduled not delivered after 3 attempts: HTTP 500")
    assert url not in why
    n.stop()


def test_a_client_error_is_not_retried(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.statuses = [404]
    n = notifier(tmp_path, url)
    n.submit("p", [sink()], [WARNING])
    settle(n, lambda: count("failed") == 1)
    assert len(state.received) == 1
    n.stop()


def test_posts_keep_to_the_sink_rate(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    clock = FakeClock()
    n = notifier(tmp_path, url, clock)
    batch = [replace(WARNING, uid=f"uid-{i}") for i in range(3)]
    n.submit("p", [sink(maxPerMinute=6)], batch)  # one post every 10 s
    state.wait_for(3)
    assert clock.slept == [10.0, 10.0]
    n.stop()


def test_a_missing_secret_or_a_non_http_url_is_a_clear_failure(tmp_path: Path) -> None:
    n = Notifier(tmp_path / "absent", timing=Timing(attempts=3))
    n.submit("p", [sink()], [WARNING])
    settle(n, lambda: count("failed") == 1)
    (why,) = n.failures("p", [sink()]).values()
    assert "set notify.secretName in the chart to a Secret with the key team-url" in why
    assert "after 1 attempt:" in why  # not retried
    n.stop()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "team-url").write_text("file:///etc/passwd")
    n = Notifier(secret, timing=Timing(attempts=3))
    metrics.NOTIFICATIONS.clear()
    n.submit("p", [sink()], [WARNING])
    settle(n, lambda: count("failed") == 1)
    assert "not an http(s) URL" in next(iter(n.failures("p", [sink()]).values()))
    n.stop()


def test_a_hanging_sink_never_blocks_submit_and_a_full_queue_drops(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    state.delay = 30.0  # the receiver hangs (until the test ends)
    n = Notifier(secrets(tmp_path, url), timing=Timing(attempts=1, timeout_s=30.0, queue_size=5))
    batch = [replace(WARNING, uid=f"uid-{i}") for i in range(200)]
    started = time.monotonic()
    n.submit("p", [sink(maxPerMinute=600)], batch)
    assert time.monotonic() - started < 1.0
    state.wait_for(1)
    assert count("dropped") >= 200 - 5 - 1
    n.stop()


def test_a_cycle_with_a_hanging_sink_takes_no_longer(tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.delay = 30.0
    spec = ENFORCE_SPEC | {"notify": [{"name": "team", "type": "CloudEvents", "urlSecretKey": "team-url"}]}
    pods = [warned_idle_pod(f"p{i}", b.NOW) for i in range(20)]
    gpus = [b.gpu(f"GPU-{i}", b.idle(), ("team-a", f"p{i}")) for i in range(20)]
    cycle_runner = runner(gpus, pods)
    report = cycle_runner.run(name="p", uid="u", generation=1, spec_raw=ENFORCE_SPEC, status_raw={})
    baseline = report.seconds
    cycle_runner.notifier = Notifier(secrets(tmp_path, url), timing=Timing(attempts=1, timeout_s=30.0))
    hanging = runner(gpus, pods)
    hanging.notifier = cycle_runner.notifier
    report = hanging.run(name="p", uid="u", generation=1, spec_raw=spec, status_raw={})
    state.wait_for(1)  # the first refusal of each eviction was offered, one post is hanging
    assert report.seconds < baseline + 0.5
    hanging.notifier.stop()


def test_a_failing_sink_turns_the_condition_false_with_one_event(
    tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    state, url = receiver
    state.statuses = [500] * 10
    spec = ENFORCE_SPEC | {"notify": [{"name": "team", "type": "CloudEvents", "urlSecretKey": "team-url"}]}
    cycle_runner = runner([b.gpu("GPU-0", b.idle(), ("team-a", "p0"))], [warned_idle_pod("p0", b.NOW)])
    cycle_runner.notifier = notifier(tmp_path, url)
    first = cycle_runner.run(name="p", uid="u", generation=1, spec_raw=spec, status_raw={})
    assert first.status is not None
    (healthy,) = [c for c in first.status.conditions if c.type == names.COND_NOTIFY]
    assert healthy.status == "True"
    settle(cycle_runner.notifier, lambda: count("failed") == 1)
    failed_events = []
    for _ in range(2):
        report = cycle_runner.run(name="p", uid="u", generation=1, spec_raw=spec, status_raw={})
        applied = cycle_runner.applier.applied  # type: ignore[attr-defined]
        failed_events = [a for a in applied if getattr(a, "reason", "") == names.EV_NOTIFICATION_FAILED]
    assert report.status is not None
    (condition,) = [c for c in report.status.conditions if c.type == names.COND_NOTIFY]
    assert condition.status == "False"
    assert condition.reason == "DeliveryFailed"
    assert "sink team: EvictionBlocked not delivered after 3 attempts: HTTP 500" in condition.message
    assert len(failed_events) == 1
    without = cycle_runner.run(name="p", uid="u", generation=1, spec_raw=ENFORCE_SPEC, status_raw={})
    assert without.status is not None
    assert [c for c in without.status.conditions if c.type == names.COND_NOTIFY] == []
    cycle_runner.notifier.stop()
