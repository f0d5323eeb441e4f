"""Clicks: a standby replica writes nothing and says "try again"; a replayed click is no patch;
Keep and Release undo each other, so the last click wins and a repeated one changes nothing."""

from __future__ import annotations

from kubernetes import client

from gpu_efficiency import metrics
from gpu_efficiency.actuators.events import EventRecorder
from gpu_efficiency.api import names
from gpu_efficiency.selfservice.clicks import Clicker, Keep, Release, _patch_for
from gpu_efficiency.selfservice.tokens import Claims

CLAIMS = Claims("team-a", "nb-0", "uid-1", "default", 2_000_000_000)


def standby_count() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "gpu_efficiency_selfservice_clicks_total", {"action": "keep", "via": "page", "result": "standby"}
    )
    return value or 0.0


def test_a_standby_replica_answers_try_again_and_counts_it() -> None:
    api = client.ApiClient(
        client.Configuration(host="http://127.0.0.1:9")
    )  # nothing listens: no call may be made
    clicker = Clicker(api, EventRecorder(api), is_leader=lambda: False)
    before = standby_count()
    outcome = clicker.apply(CLAIMS, Keep("2h"), remote="10.0.0.1", via="page")
    assert outcome.status == 503
    assert not outcome.changed
    assert "try again" in outcome.message
    assert standby_count() == before + 1


def test_a_replayed_keep_is_no_patch() -> None:
    patch, told, _ = _patch_for(Keep("2h"), {names.KEEP_FOR: "2h"}, 0.0)
    assert patch == {}
    assert told.startswith("already kept")


def test_keep_after_release_takes_the_release_back_and_release_after_keep_takes_the_keep() -> None:
    patch, _, _ = _patch_for(Keep("2h"), {names.KEEP_FOR: "2h", names.RELEASE: "2026-01-01T00:00:00Z"}, 0.0)
    assert patch == {names.KEEP_FOR: "2h", names.RELEASE: None}
    patch, _, _ = _patch_for(Release(), {names.KEEP_FOR: "2h", names.KEEP_UNTIL: "2030-01-01T00:00:00Z"}, 0.0)
    assert patch == {names.RELEASE: "1970-01-01T00:00:00Z", names.KEEP_FOR: None, names.KEEP_UNTIL: None}
    assert _patch_for(Release(), {names.RELEASE: "1970-01-01T00:00:00Z"}, 5.0)[0] == {}
