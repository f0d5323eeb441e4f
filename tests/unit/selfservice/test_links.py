"""The signed link goes into a warning (annotation and event), changes with the deadline, goes with
the warning, and costs no write in steady state."""

from __future__ import annotations

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import AnnotatePod, PodEvent
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger
from gpu_efficiency.selfservice.links import Linker, with_link, with_links
from gpu_efficiency.selfservice.tokens import verify
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_faults")
LINKER = Linker(b"s" * 32, "https://gpu.example.com")
P = ("team-a", "p")


def idle_for_an_hour(extra: dict[str, str] | None = None, signals: object = None):  # type: ignore[no-untyped-def]
    ann = {names.IDLE_SINCE: format_rfc3339(NOW - 3600), **(extra or {})}
    spec = enforce(idle={"idle_for": "5m", "warning_period": "1h"})
    return snapshot(
        [gpu("GPU-0", signals if signals is not None else b.idle(), P)], [pod("p", annotations=ann)], spec
    )  # type: ignore[arg-type]


def test_a_new_warning_carries_the_link_in_its_annotation_and_its_event() -> None:
    snap = idle_for_an_hour()
    plan = with_links(plan_cycle(snap, ledger=IdleLedger()), snap, LINKER)
    [patch] = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    url = patch.annotations[names.SELF_SERVICE]
    assert isinstance(url, str)
    assert url.startswith("https://gpu.example.com/gpu?t=")
    claims = verify(LINKER.key, url.split("t=", 1)[1], NOW)
    assert (claims.namespace, claims.pod, claims.uid, claims.policy) == (
        "team-a",
        "p",
        "uid-team-a-p",
        "test-policy",
    )
    assert claims.expires == int(NOW + 3600)  # the deadline the warning announces
    [event] = [a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_SCHEDULED]
    assert url in event.message
    assert event.message.endswith("gpuefficiency.io/keep-for=4h --overwrite")  # the kubectl line stays whole


def test_steady_state_writes_nothing_and_a_withdrawn_warning_takes_its_link() -> None:
    snap = idle_for_an_hour()
    ledger = IdleLedger()
    snap = apply_plan(snap, with_links(plan_cycle(snap, ledger=ledger), snap, LINKER))
    again = with_links(plan_cycle(snap, ledger=ledger), snap, LINKER)
    assert not [
        a for a in again.actions if isinstance(a, AnnotatePod) and names.SELF_SERVICE in a.annotations
    ]
    busy = b.with_signals(snap, "GPU-0", b.compute_bound())
    cancelled = with_links(plan_cycle(busy, ledger=ledger), busy, LINKER)
    patches = [a for a in cancelled.actions if isinstance(a, AnnotatePod)]
    assert patches
    assert patches[0].annotations[names.SELF_SERVICE] is None


def test_a_link_is_added_to_a_pod_warned_before_links_were_enabled() -> None:
    snap = idle_for_an_hour({names.EVICT_AFTER: format_rfc3339(NOW + 1800)})
    plan = with_links(plan_cycle(snap, ledger=IdleLedger()), snap, LINKER)
    urls = [a.annotations.get(names.SELF_SERVICE) for a in plan.actions if isinstance(a, AnnotatePod)]
    assert any(urls)
    assert verify(LINKER.key, str(urls[-1]).split("t=", 1)[1], NOW).expires == int(NOW + 1800)


def test_the_link_fits_the_event_limit_and_keeps_the_command() -> None:
    text = with_link("x" * 2000 + ". To keep it: kubectl annotate pod p", "https://h/gpu?t=abc")
    assert len(text) <= 1024
    assert text.endswith(". To keep it: kubectl annotate pod p")
    assert "https://h/gpu?t=abc" in text


def test_the_cloudevent_and_the_slack_message_carry_the_same_link() -> None:
    from gpu_efficiency.actuators.notify.wire import cloudevent, slack_message
    from gpu_efficiency.engine.notify.messages import notifications

    snap = idle_for_an_hour()
    plan = with_links(plan_cycle(snap, ledger=IdleLedger()), snap, LINKER)
    [url] = [a.annotations[names.SELF_SERVICE] for a in plan.actions if isinstance(a, AnnotatePod)]
    batch = notifications(plan.actions, [], snap, plan, window_s=600, max_keep_s=14400, keep_allowed=True)
    [warning] = [n for n in batch if n.reason == names.EV_EVICTION_SCHEDULED]
    assert cloudevent(warning)["data"]["selfService"] == url
    assert f"<{url}|open the page>" in str(slack_message(warning)["blocks"])


def test_without_links_the_messages_carry_none() -> None:
    from gpu_efficiency.actuators.notify.wire import cloudevent, slack_message
    from gpu_efficiency.engine.notify.messages import notifications

    snap = idle_for_an_hour()
    plan = plan_cycle(snap, ledger=IdleLedger())
    batch = notifications(plan.actions, [], snap, plan, window_s=600, max_keep_s=14400, keep_allowed=True)
    [warning] = [n for n in batch if n.reason == names.EV_EVICTION_SCHEDULED]
    assert cloudevent(warning)["data"]["selfService"] is None
    assert "open the page" not in str(slack_message(warning))
