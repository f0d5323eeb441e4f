"""Per-namespace Slack webhooks in the notifier, against a real HTTP receiver on 127.0.0.1: a
namespace that names its own webhook key gets its messages there, the others get the sink's; a
key missing from the Secret falls back to the sink's webhook and says so, without the URL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from tests.unit.actuators.notify.test_delivery import WARNING, FakeClock, settle

from gpu_efficiency.actuators.notify.delivery import Notifier, Timing
from gpu_efficiency.api.policy import NotifySink


@pytest.fixture
def paths() -> Iterator[tuple[list[tuple[str, bytes]], str]]:
    """A receiver that keeps (path, body) of each POST and answers 200."""
    received: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers.get("Content-Length", "0")))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield received, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def slack(**fields: object) -> NotifySink:
    return NotifySink.model_validate({"name": "chat", "type": "Slack", "urlSecretKey": "shared", **fields})


def notifier(secret_dir: Path) -> Notifier:
    clock = FakeClock()
    return Notifier(
        secret_dir, timing=Timing(attempts=1, timeout_s=2.0), sleep=clock.sleep, monotonic=clock.monotonic
    )


def wait(received: list[tuple[str, bytes]], count: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # nothing more arrives
    return sorted(path for path, _ in received)


def test_each_namespace_s_messages_reach_its_own_webhook(
    tmp_path: Path, paths: tuple[list[tuple[str, bytes]], str]
) -> None:
    received, base = paths
    for key in ("shared", "slack-a", "slack-b"):
        (tmp_path / key).write_text(f"{base}/{key}\n")
    n = notifier(tmp_path)
    batch = [
        replace(WARNING, namespace="team-a", uid="a", slack_url_key="slack-a"),
        replace(WARNING, namespace="team-b", uid="b", slack_url_key="slack-b"),
        replace(WARNING, namespace="team-c", uid="c"),
    ]
    n.submit("p", [slack()], batch)
    assert wait(received, 3) == ["/shared", "/slack-a", "/slack-b"]
    by_path = {path: orjson.loads(body) for path, body in received}
    assert "team-a/nb-0" in by_path["/slack-a"]["blocks"][0]["text"]["text"]
    assert "team-b/nb-0" in by_path["/slack-b"]["blocks"][0]["text"]["text"]
    settle(n, lambda: n.failures("p", [slack()]) == {})
    n.stop()


def test_a_cloudevents_sink_ignores_the_namespace_s_slack_webhook(
    tmp_path: Path, paths: tuple[list[tuple[str, bytes]], str]
) -> None:
    received, base = paths
    for key in ("ce", "slack-a"):
        (tmp_path / key).write_text(f"{base}/{key}\n")
    n = notifier(tmp_path)
    ce = NotifySink.model_validate({"name": "ce", "type": "CloudEvents", "urlSecretKey": "ce"})
    n.submit("p", [ce], [replace(WARNING, slack_url_key="slack-a")])
    assert wait(received, 1) == ["/ce"]
    n.stop()


def test_a_key_missing_from_the_secret_falls_back_and_is_reported_without_the_url(
    tmp_path: Path, paths: tuple[list[tuple[str, bytes]], str]
) -> None:
    received, base = paths
    (tmp_path / "shared").write_text(f"{base}/shared?token=s3cret\n")
    n = notifier(tmp_path)
    n.submit("p", [slack()], [replace(WARNING, slack_url_key="slack-gone")])
    assert wait(received, 1) == ["/shared?token=s3cret"]
    settle(n, lambda: bool(n.misrouted("p")))
    assert n.failures("p", [slack()]) == {}  # delivered: not a delivery failure
    assert list(n.misrouted("p")) == ["team-a"]
    (why,) = n.misrouted("p").values()
    assert why.startswith("sink chat: its gpuefficiency.io/slack-url-secret-key was not used")
    assert "slack-gone" in why
    assert "posted to the sink's own webhook" in why
    assert "s3cret" not in why
    assert base not in why
    # The key appears in the Secret: the next message goes there and the report clears.
    (tmp_path / "slack-gone").write_text(f"{base}/team-a\n")
    n.submit(
        "p", [slack()], [replace(WARNING, slack_url_key="slack-gone", deadline=(WARNING.deadline or 0) + 60)]
    )
    assert wait(received, 2) == ["/shared?token=s3cret", "/team-a"]
    settle(n, lambda: n.misrouted("p") == {})
    n.stop()
