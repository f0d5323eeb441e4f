"""The one-line acknowledgement keep-for=<duration>: counted from when the operator first saw it,
bounded by maxKeep, never extended by edits, and a bad value is told once and changes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, annotations_of, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, PodEvent, Snapshot
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.acknowledge import ending_with, keep_command, parse_keep_for
from gpu_efficiency.engine.reclaim.idleledger import IdleLedger

pytestmark = pytest.mark.usefixtures("no_faults")

P = ("team-a", "p")
KEEP = "kubectl annotate pod p -n team-a gpuefficiency.io/keep-for=4h --overwrite"


def warned(annotations: dict[str, str], **idle: str) -> Snapshot:
    """An idle pod whose warning ran out a minute ago, with ``annotations`` added."""
    base = {
        names.IDLE_SINCE: format_rfc3339(NOW - 3600),
        names.EVICT_AFTER: format_rfc3339(NOW - 60),
        names.STATE: "Warned",
    }
    spec = enforce(idle={"idle_for": "5m", "warning_period": "5m", **idle})
    return snapshot([gpu("GPU-0", b.idle(), P)], [pod("p", annotations=base | annotations)], spec)


def run(snap: Snapshot, cycles: int, *, advance: float = 60.0) -> tuple[list[list[object]], Snapshot]:
    actions = []
    ledger = IdleLedger()
    for _ in range(cycles):
        plan = plan_cycle(snap, ledger=ledger)
        actions.append(list(plan.actions))
        snap = apply_plan(snap, plan, advance=advance)
    return actions, snap


def evicted(actions: list[object]) -> bool:
    return any(isinstance(a, EvictPod) for a in actions)


@pytest.mark.parametrize(("text", "seconds"), [("4h", 14400.0), ("90m", 5400.0), ("1h30m", 5400.0)])
def test_keep_for_reads_go_durations(text: str, seconds: float) -> None:
    assert parse_keep_for(text) == seconds


@pytest.mark.parametrize("text", ["4 hours", "", "-4h", "0s", "2026-01-01T00:00:00Z", "4d"])
def test_keep_for_rejects_what_is_not_a_positive_duration(text: str) -> None:
    with pytest.raises(ValueError, match=r"keep-for"):
        parse_keep_for(text)


def test_keep_for_stops_the_eviction_from_when_it_was_first_seen() -> None:
    actions, after = run(warned({names.KEEP_FOR: "4h"}), 3)
    assert not any(evicted(a) for a in actions)
    ann = annotations_of(after, *P)
    assert ann[names.KEEP_SEEN] == format_rfc3339(NOW)
    assert names.EVICT_AFTER not in ann  # a warning that cannot come true is withdrawn


def test_keep_for_runs_out_after_its_duration() -> None:
    snap = warned({names.KEEP_FOR: "30m"})
    actions, _ = run(snap, 40)  # one cycle a minute
    first = next(i for i, a in enumerate(actions) if any(isinstance(x, PodEvent) and x.reason == names.EV_EVICTION_SCHEDULED for x in a))  # fmt: skip
    assert first == 30  # honoured for exactly 30 minutes from when it was seen, then warned again


def test_keep_for_longer_than_max_keep_is_bounded_by_it() -> None:
    actions, _ = run(warned({names.KEEP_FOR: "100h"}, max_keep="1h"), 70)
    scheduled = [i for i, a in enumerate(actions) if any(isinstance(x, PodEvent) and x.reason == names.EV_EVICTION_SCHEDULED for x in a)]  # fmt: skip
    assert scheduled == [60]


def test_a_seen_time_in_the_future_does_not_extend_keep_for() -> None:
    tampered = warned({names.KEEP_FOR: "1h", names.KEEP_SEEN: format_rfc3339(NOW + 86400)}, max_keep="1h")
    plan = plan_cycle(tampered)
    (patch,) = [a for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch.annotations[names.KEEP_SEEN] == format_rfc3339(NOW)  # the future one is ignored


def test_removing_and_re_adding_keep_for_keeps_its_first_bound() -> None:
    snap = warned({names.KEEP_FOR: "1h"}, max_keep="1h")
    ledger = IdleLedger()
    for _ in range(30):
        plan = plan_cycle(snap, ledger=ledger)
        snap = apply_plan(snap, plan)
    # the owner removes both annotations and adds keep-for again, hoping for a fresh hour
    pods = tuple(
        replace(p, annotations={k: v for k, v in p.annotations.items() if k != names.KEEP_SEEN})
        for p in snap.pods
    )
    snap = replace(snap, pods=pods)
    scheduled_at = None
    for minute in range(30, 70):
        plan = plan_cycle(snap, ledger=ledger)
        if any(isinstance(a, PodEvent) and a.reason == names.EV_EVICTION_SCHEDULED for a in plan.actions):
            scheduled_at = minute
            break
        snap = apply_plan(snap, plan)
    assert scheduled_at == 60


def test_an_unreadable_keep_for_is_told_once_and_changes_nothing_else() -> None:
    actions, _after = run(warned({names.KEEP_FOR: "4 hours"}), 3)
    invalid = [x for a in actions for x in a if isinstance(x, PodEvent) and x.reason == names.EV_ACK_INVALID]
    assert len(invalid) == 1
    assert invalid[0].type == "Warning"
    assert "write it like 4h" in invalid[0].message
    assert evicted(actions[0])  # not held: the warning had run out, and a bad value keeps nothing


def test_keep_for_is_ignored_where_the_policy_honours_no_acknowledgement() -> None:
    actions, _ = run(warned({names.KEEP_FOR: "4h"}, allow_keep_until=False), 1)  # type: ignore[arg-type]
    assert evicted(actions[0])


def test_the_warning_event_ends_with_the_exact_command_even_when_long() -> None:
    spec = enforce()
    snap = snapshot([gpu("GPU-0", b.idle(), P)], [pod("p")], spec)
    messages = []
    for _ in range(8):
        plan = plan_cycle(snap)
        messages += [a.message for a in plan.actions if isinstance(a, PodEvent)]
        snap = apply_plan(snap, plan)
    (warning,) = [m for m in messages if "will be evicted after" in m]
    assert warning.endswith(f"To keep it: {KEEP}")
    long = ending_with("x" * 5000, f". To keep it: {KEEP}")
    assert len(long) == 1024
    assert long.endswith(KEEP)


def test_the_command_asks_for_at_most_max_keep() -> None:
    assert (
        keep_command("ns", "p", 3600)
        == "kubectl annotate pod p -n ns gpuefficiency.io/keep-for=1h --overwrite"
    )
    assert keep_command("ns", "p", 86400).endswith("keep-for=4h --overwrite")
