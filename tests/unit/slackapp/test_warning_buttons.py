"""The buttons reach the Slack warning the notifier posts (actuators/notify/delivery.py): only with the Slack
app configured, only on a warning that carries a self-service link, with that link's token, and
with the Keep for choices the policy allows; CloudEvents bodies never change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from gpu_efficiency.actuators.notify.delivery import Notifier, Timing, encode
from gpu_efficiency.api.policy import NotifySink
from gpu_efficiency.selfservice.rules import keep_choices
from gpu_efficiency.selfservice.tokens import Claims, link, sign
from tests.unit.actuators.notify.test_delivery import WARNING
from tests.unit.actuators.notify.test_routes import paths, wait  # noqa: F401

TOKEN = sign(b"k" * 32, Claims("team-a", "nb-0", "uid-1", "p", 1_900_000_000))
LINKED = replace(WARNING, link=link("https://gpu.example.com", TOKEN))
SLACK = NotifySink.model_validate({"name": "s", "type": "Slack", "urlSecretKey": "k"})
CE = NotifySink.model_validate({"name": "c", "type": "CloudEvents", "urlSecretKey": "k"})


def blocks(body: bytes) -> list[dict[str, Any]]:
    return list(orjson.loads(body)["blocks"])


def test_the_slack_warning_gets_buttons_with_the_link_s_token(tmp_path: Path) -> None:
    choices = keep_choices(True, 4 * 3600)
    found = blocks(encode(SLACK, LINKED, choices).body)
    (actions,) = [b for b in found if b["type"] == "actions"]
    assert [e["text"]["text"] for e in actions["elements"]] == [
        "Keep for 1h", "Keep for 2h", "Keep for 4h", "Release now",
    ]  # fmt: skip
    assert {e["value"] for e in actions["elements"]} == {TOKEN}
    assert found[-1]["type"] == "context"


def test_no_buttons_without_the_slack_app_a_link_or_on_a_cloudevent() -> None:
    assert all(b["type"] != "actions" for b in blocks(encode(SLACK, LINKED, None).body))
    assert all(b["type"] != "actions" for b in blocks(encode(SLACK, WARNING, ("1h",)).body))
    assert encode(CE, LINKED, ("1h",)).body == encode(CE, LINKED, None).body


def test_a_policy_without_keep_gets_only_release() -> None:
    (actions,) = [
        b for b in blocks(encode(SLACK, LINKED, keep_choices(False, 86400)).body) if b["type"] == "actions"
    ]
    assert [e["action_id"] for e in actions["elements"]] == ["gpuefficiency.release"]


def test_the_notifier_adds_buttons_only_where_the_slack_app_is_configured(
    tmp_path: Path,
    paths: tuple[list[tuple[str, bytes]], str],  # noqa: F811
) -> None:
    received, base = paths
    (tmp_path / "k").write_text(f"{base}/hook\n")
    for configured, uid in ((True, "a"), (False, "b")):
        n = Notifier(tmp_path, timing=Timing(attempts=1, timeout_s=2.0), slack_buttons=configured)
        n.submit("p", [SLACK], [replace(LINKED, uid=uid)], keep_choices=("2h",))
        wait(received, 1 if configured else 2)
        n.stop()
    with_app, without = (blocks(body) for _, body in received)
    assert [b["type"] for b in with_app].count("actions") == 1
    assert [b["type"] for b in without].count("actions") == 0
