"""What a researcher reads on their pod must be true and theirs to act on: stopping a kernel does not
free a GPU, thermal throttling is not their fault, a missing exporter is not their task, and a
deadline says how far away it is, not only when in UTC."""

from __future__ import annotations

import re

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

from gpu_efficiency.actuators.notify.wire import slack_message
from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_relative, format_rfc3339, format_when
from gpu_efficiency.engine.model import AnnotatePod, Diagnosis, PodEvent
from gpu_efficiency.engine.notify.messages import Notification
from gpu_efficiency.engine.planner import explain_pod, plan_cycle
from gpu_efficiency.engine.reclaim.underutilization import RECOMMENDATIONS

pytestmark = pytest.mark.usefixtures("no_faults")


def test_the_idle_remedy_is_one_that_frees_the_gpu() -> None:
    text = RECOMMENDATIONS[Diagnosis.IDLE]
    assert "stop the notebook server" in text
    assert "stopping only the kernel keeps the GPU allocated" in text
    assert not re.search(r"stop the notebook kernel\)?$", text)


def test_insufficient_data_asks_nothing_of_the_pods_owner() -> None:
    text = RECOMMENDATIONS[Diagnosis.INSUFFICIENT_DATA]
    assert text.startswith("nothing to do")
    assert "dcgm-exporter" not in text


def test_thermal_throttling_is_not_blamed_on_the_researcher() -> None:
    snap = snapshot([gpu("GPU-0", b.thermal_throttled(), ("team-a", "train"))], [pod("train")], b.policy())
    plan = plan_cycle(snap)
    (event,) = [a for a in plan.actions if isinstance(a, PodEvent) and a.reason == names.EV_UNDERUTILIZED]
    assert event.message.startswith("this GPU is slowed by heat (thermal throttling), not by your code: ")
    assert "underused" not in event.message
    (patch,) = [a.annotations for a in plan.actions if isinstance(a, AnnotatePod)]
    assert patch[names.RECOMMENDATION] == RECOMMENDATIONS[Diagnosis.THERMAL_THROTTLING]
    assert patch[names.RECOMMENDATION].startswith("nothing to fix in your code")


def test_other_diagnoses_keep_their_underused_wording() -> None:
    snap = snapshot([gpu("GPU-0", b.input_starved(), ("team-a", "train"))], [pod("train")], b.policy())
    (event,) = [a for a in plan_cycle(snap).actions if isinstance(a, PodEvent)]
    assert event.message.startswith("this GPU is underused (input starved): ")


@pytest.mark.parametrize(
    ("offset", "words"),
    [
        (840.0, "in 14m"),
        (839.6, "in 14m"),
        (-300.0, "5m ago"),
        (30.0, "in 30s"),
        (0.2, "now"),
        (5400.0, "in 1h30m"),
    ],
)
def test_relative_times_read_as_people_say_them(offset: float, words: str) -> None:
    assert format_relative(NOW + offset, NOW) == words


def test_the_warning_says_when_in_utc_and_how_far_away_and_why_the_idle_time_adds_up() -> None:
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [pod("p")], enforce())
    events: list[PodEvent] = []
    for _ in range(11):  # idleFor 5m, warningPeriod 5m, window 10m
        plan = plan_cycle(snap)
        events += [a for a in plan.actions if isinstance(a, PodEvent)]
        snap = apply_plan(snap, plan)
    warning = next(e for e in events if e.reason == names.EV_EVICTION_SCHEDULED)
    # at minute 5: idle-since was set at minute 0, after a whole 10m window without work
    assert warning.message.startswith(
        f"this GPU has done no work for 15m: the pod will be evicted after {format_when(NOW + 600, NOW + 300)} "
    )
    assert "(in 5m) unless its GPU becomes active" in warning.message
    assert (
        f"Idle since {format_when(NOW, NOW + 300)}, after a whole 10m window without work" in warning.message
    )
    assert "(5m ago)" in warning.message


def test_an_acknowledged_pod_is_told_until_when_and_how_long() -> None:
    kept = pod("p", annotations={names.KEEP_FOR: "4h", names.KEEP_SEEN: format_rfc3339(NOW)})
    snap = snapshot([gpu("GPU-0", b.idle(), ("team-a", "p"))], [kept], enforce())
    lines = "\n".join(explain_pod(snap, "team-a", "p"))
    assert f"honoured until {format_when(NOW + 4 * 3600, NOW)}" in lines
    assert "(in 4h)" in lines


def test_the_slack_deadline_reads_in_whole_minutes() -> None:
    n = Notification(
        policy="p",
        reason=names.EV_EVICTION_SCHEDULED,
        type="Warning",
        time=NOW,
        kind="Pod",
        name="nb-0",
        uid="u",
        message="m",
        namespace="team-a",
        deadline=NOW + 899.5,
    )
    text = str(slack_message(n))
    assert "(in 15m)" in text


def test_the_readme_diagnosis_table_has_every_diagnosis() -> None:
    from tests.unit.user_docs import DOCS

    readme = (DOCS / "what-you-see.md").read_text()
    table = readme[readme.index("| diagnosis | pattern |") :].split("\n\n", 1)[0]
    listed = {line.split("|")[1].strip() for line in table.splitlines()[2:]}
    assert listed == {d.value for d in Diagnosis}
