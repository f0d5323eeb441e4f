"""Stragglers: the robust rule, who is judged, the cause, and what is said (once per change)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import builders as b

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import (
    AnnotatePod,
    GPUSample,
    NodeEvent,
    OwnerEvent,
    OwnerRef,
    Plan,
    PodEvent,
    PodView,
    Signal,
    Snapshot,
    Stats,
)
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.stragglers.evaluate import NO_HARDWARE, outliers_below, robust_spread

pytestmark = pytest.mark.usefixtures("no_faults")
no_faults = b.no_faults

JOB = OwnerRef("batch/v1", "Job", "train", "uid-job-train")
CLOCK = 1980.0


def trainer(
    sm: float = 0.85, tensor: float = 0.5, clock: float = CLOCK, power: float = 600.0, **extra: Stats
) -> dict[Signal, Stats]:
    """A busy training GPU; ``extra`` (Signal names) adds or replaces readings."""
    base = b.compute_bound() | {
        Signal.SM_ACTIVE: b.stats(sm, min(1.0, sm + 0.05)),
        Signal.TENSOR_ACTIVE: b.stats(tensor),
        Signal.SM_CLOCK: b.stats(clock),
        Signal.POWER: b.stats(power, power + 50),
        Signal.CLOCK_EVENTS: b.stats(4.0),  # every GPU at its power cap: no cause by itself
    }
    return base | {Signal[name]: value for name, value in extra.items()}


def job(
    readings: list[Mapping[Signal, Stats]],
    *,
    gpus_per_pod: int = 1,
    labels: Mapping[str, str] | None = None,
    start_time: float = b.NOW - 86400,
    controller: OwnerRef | None = JOB,
    prefix: str = "train",
) -> tuple[list[GPUSample], list[PodView]]:
    """Pods of one Job, ``gpus_per_pod`` GPUs each, on one node per pod."""
    gpus, pods = [], []
    for p in range(len(readings) // gpus_per_pod):
        name, node = f"{prefix}-{p}", f"node-{p}"
        pod = replace(
            b.pod(name, node=node, labels=labels or {"batch.kubernetes.io/job-name": "train"},
                  start_time=start_time, gpu_request=gpus_per_pod),
            controller=controller, controller_kind=controller.kind if controller else None,
        )  # fmt: skip
        pods.append(pod)
        for g in range(gpus_per_pod):
            i = p * gpus_per_pod + g
            gpus.append(b.gpu(f"GPU-{prefix}-{p}-{g}", readings[i], ("team-a", name), node=node))
    return gpus, pods


def spec(**stragglers: Any) -> Any:
    return b.policy(stragglers={"enabled": True, "for_duration": "2m", **stragglers})


def snap(readings: list[Mapping[Signal, Stats]], **kwargs: Any) -> Snapshot:
    policy = kwargs.pop("policy", None) or spec()
    gpus, pods = job(readings, **kwargs)
    return b.snapshot(gpus, pods, policy)


def straggler_annotations(plan: Plan) -> dict[str, str | None]:
    return {
        a.name: a.annotations[names.STRAGGLER]
        for a in plan.actions
        if isinstance(a, AnnotatePod) and names.STRAGGLER in a.annotations
    }


def events(plan: Plan) -> list[PodEvent | OwnerEvent | NodeEvent]:
    return [
        a
        for a in plan.actions
        if isinstance(a, PodEvent | OwnerEvent | NodeEvent)
        and a.reason in (names.EV_STRAGGLER, names.EV_STRAGGLER_CLEARED)
    ]


def run(snapshot: Snapshot, cycles: int, advance: float = 60.0) -> tuple[Snapshot, Plan]:
    """``cycles`` cycles, each applied perfectly; returns the last snapshot and its plan."""
    plan = plan_cycle(snapshot)
    for _ in range(cycles - 1):
        snapshot = b.apply_plan(snapshot, plan, advance=advance)
        plan = plan_cycle(snapshot)
    return snapshot, plan


def confirmed(readings: list[Mapping[Signal, Stats]], **kwargs: Any) -> Plan:
    """The plan of the cycle in which forDuration (2m) has passed: the third, 60 s apart."""
    return run(snap(readings, **kwargs), 3)[1]


# ---- the robust rule ------------------------------------------------------------------------------


def test_one_slow_gpu_cannot_hide_itself_by_widening_the_spread() -> None:
    """Mean and standard deviation: one outlier among n values is never more than (n-1)/sqrt(n)
    deviations out (2.5 for 8 GPUs), however slow, because it widens the deviation itself; the
    median and MAD ignore it."""
    values = {f"g{i}": 1980.0 + (i % 3) * 5 for i in range(7)} | {"slow": 1200.0}
    mean = sum(values.values()) / len(values)
    sigma = (sum((v - mean) ** 2 for v in values.values()) / len(values)) ** 0.5
    assert (mean - values["slow"]) / sigma < 3
    centre, spread = robust_spread(list(values.values()))
    assert centre == pytest.approx(1982.5)
    assert spread < 10
    assert set(outliers_below(values, 3.0, 0.1)) == {"slow"}


def test_identical_gpus_with_noise_never_make_a_straggler() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(4, 64)
        values = {f"g{i}": rng.gauss(1980.0, 20.0) for i in range(n)}
        assert outliers_below(values, 3.0, 0.1) == {}


def test_the_slowed_gpu_is_the_one_flagged_among_noisy_peers() -> None:
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(4, 64)
        values = {f"g{i}": rng.gauss(0.85, 0.01) for i in range(n)}
        slow = f"g{rng.randrange(n)}"
        values[slow] *= 0.75
        assert set(outliers_below(values, 3.0, 0.1)) == {slow}


def test_both_thresholds_are_required() -> None:
    # identical peers (MAD 0): 5 % below is past any number of MADs, but not 10 % below
    close = {f"g{i}": 1980.0 for i in range(7)} | {"x": 1881.0}
    assert outliers_below(close, 3.0, 0.1) == {}
    # noisy peers: 14 % below but within 3 scaled MADs
    noisy = {"a": 0.50, "b": 0.60, "c": 0.70, "d": 0.80, "e": 0.90, "f": 1.0, "x": 0.60}
    centre, spread = robust_spread(list(noisy.values()))
    assert centre - noisy["x"] > 0.1 * centre
    assert centre - noisy["x"] < 3 * spread
    assert outliers_below(noisy, 3.0, 0.1) == {}
    # and past both: flagged
    assert set(outliers_below(close | {"x": 1500.0}, 3.0, 0.1)) == {"x"}


# ---- who is judged ----------------------------------------------------------------------------------


def slowed(n: int = 8, index: int = 3, **slow: Any) -> list[Mapping[Signal, Stats]]:
    readings: list[Mapping[Signal, Stats]] = [trainer(clock=CLOCK + 5 * (i % 3)) for i in range(n)]
    readings[index] = trainer(**slow)
    return readings


def test_a_busy_group_reports_its_straggler_on_every_pod_after_for_duration() -> None:
    readings = slowed(clock=1200.0, power=420.0, CLOCK_EVENTS=b.stats(0x24, 0x64))
    first = plan_cycle(snap(readings))
    assert straggler_annotations(first) == {}  # slow now, but not for forDuration yet
    since = [
        a for a in first.actions if isinstance(a, AnnotatePod) and names.STRAGGLER_SINCE in a.annotations
    ]
    assert [a.name for a in since] == ["train-3"]
    plan = confirmed(readings)
    written = straggler_annotations(plan)
    assert set(written) == {f"train-{i}" for i in range(8)}
    text = written["train-0"] or ""
    assert "team-a/train-3 on node node-3 GPU 0 (GPU-train-3-0) is 40% slower" in text
    assert "cause: thermal slowdown" in text
    assert plan.stragglers == (("team-a", "job/train", 1),)


def test_a_group_slowing_down_together_has_no_straggler() -> None:
    readings = [trainer(sm=0.45, tensor=0.2, clock=1500.0 + i, power=350.0) for i in range(8)]
    plan = confirmed(readings)
    assert straggler_annotations(plan) == {}
    assert plan.stragglers == (("team-a", "job/train", 0),)


def test_an_idle_group_is_not_judged() -> None:
    readings = [b.idle() | {Signal.SM_CLOCK: b.stats(345.0)} for _ in range(7)]
    readings.append(b.idle() | {Signal.SM_CLOCK: b.stats(210.0)})
    plan = confirmed(readings)
    assert straggler_annotations(plan) == {}
    assert plan.stragglers == ()


def test_a_warming_up_group_is_not_judged() -> None:
    plan = confirmed(slowed(clock=1200.0), start_time=b.NOW - 60)
    assert straggler_annotations(plan) == {}
    assert plan.stragglers == ()


def test_a_group_smaller_than_min_gpus_is_not_judged() -> None:
    readings = slowed(n=3, index=1, clock=1200.0)
    assert straggler_annotations(confirmed(readings)) == {}
    small = confirmed(readings, policy=spec(min_gpus=3))
    assert len(straggler_annotations(small)) == 3


def test_stragglers_are_off_by_default_and_turning_them_off_clears_the_annotation() -> None:
    readings = slowed(clock=1200.0)
    assert straggler_annotations(confirmed(readings, policy=b.policy())) == {}
    reported, _ = run(snap(readings), 4)
    off = plan_cycle(replace(reported, policy=b.policy()))
    assert set(straggler_annotations(off).values()) == {None}


def test_pods_of_a_job_set_group_by_the_job_set_not_their_child_jobs() -> None:
    labels = {"jobset.sigs.k8s.io/jobset-name": "big", "batch.kubernetes.io/job-name": "big-workers-0"}
    plan = confirmed(slowed(clock=1200.0), labels=labels)
    assert plan.stragglers == (("team-a", "jobset/big", 1),)


def test_group_by_labels_the_policy_names_come_first() -> None:
    labels = {"team.example/run": "r7", "batch.kubernetes.io/job-name": "train"}
    plan = confirmed(slowed(clock=1200.0), labels=labels, policy=spec(group_by=["team.example/run"]))
    assert plan.stragglers == (("team-a", "label team.example/run=r7", 1),)


def test_a_pod_in_no_job_is_not_grouped() -> None:
    plan = confirmed(slowed(clock=1200.0), labels={"app": "x"}, controller=None)
    assert plan.stragglers == ()


# ---- cause ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slow", "cause"),
    [
        ({"clock": 1200.0, "CLOCK_EVENTS": b.stats(0x24, 0x64)}, "thermal slowdown"),
        ({"clock": 1200.0, "CLOCK_EVENTS": b.stats(0x80, 0x84)}, "power slowdown"),
        ({"clock": 1200.0, "GPU_TEMP": b.stats(88.0, 91.0)}, "thermal slowdown"),
        ({"clock": 1200.0}, "lower SM clock with no clock event"),
        ({"sm": 0.55, "tensor": 0.3, "power": 420.0}, NO_HARDWARE),
    ],
)
def test_the_cause_is_named_from_the_gpus_own_signals(slow: dict[str, Any], cause: str) -> None:
    extra = {k: v for k, v in slow.items() if k.isupper()}
    plain = {k: v for k, v in slow.items() if not k.isupper()}
    plan = confirmed(slowed(**plain, **extra))
    text = straggler_annotations(plan)["train-0"] or ""
    assert text.endswith(f"cause: {cause}")
    node_events = [e for e in events(plan) if isinstance(e, NodeEvent)]
    assert len(node_events) == (0 if cause == NO_HARDWARE else 1)


def test_a_clock_event_every_peer_shows_is_not_the_cause() -> None:
    """At full load every GPU may sit at its power cap (0x4): that alone slows none of them."""
    plan = confirmed(slowed(sm=0.55, tensor=0.3, power=420.0, CLOCK_EVENTS=b.stats(4.0)))
    assert (straggler_annotations(plan)["train-0"] or "").endswith(f"cause: {NO_HARDWARE}")


# ---- saying it once per change --------------------------------------------------------------------


def test_events_go_out_once_per_change_never_per_cycle() -> None:
    readings = slowed(clock=1200.0, CLOCK_EVENTS=b.stats(0x24, 0x64))
    snapshot, plan = run(snap(readings), 3)
    said = events(plan)
    assert sorted(type(e).__name__ for e in said) == ["NodeEvent", "OwnerEvent", "PodEvent"]
    owner_event = next(e for e in said if isinstance(e, OwnerEvent))
    assert owner_event.owner == JOB
    assert "train-3" in owner_event.message
    pod_event = next(e for e in said if isinstance(e, PodEvent))
    assert pod_event.name == "train-3"
    assert "40% slower" in pod_event.message
    # steady: the same straggler, its slowdown moving by less than 10 points: no write, no event
    snapshot = b.apply_plan(snapshot, plan)
    steady = b.with_signals(
        snapshot, "GPU-train-3-0", trainer(clock=1250.0, CLOCK_EVENTS=b.stats(0x24, 0x64))
    )
    plan = plan_cycle(steady)
    assert events(plan) == []
    assert straggler_annotations(plan) == {}
    # recovered: the annotation goes from every pod, one cleared event on the pod that was slow
    recovered = b.with_signals(b.apply_plan(steady, plan), "GPU-train-3-0", trainer())
    plan = plan_cycle(recovered)
    assert set(straggler_annotations(plan).values()) == {None}
    assert [(e.name, e.reason) for e in events(plan) if isinstance(e, PodEvent)] == [
        ("train-3", names.EV_STRAGGLER_CLEARED)
    ]
    plan = plan_cycle(b.apply_plan(recovered, plan))
    assert events(plan) == []
    assert straggler_annotations(plan) == {}


def test_a_restart_neither_forgets_nor_repeats_a_straggler() -> None:
    """The since-clock and what was reported live on the pods, not in the process."""
    readings = slowed(clock=1200.0)
    snapshot, plan = run(snap(readings), 2)  # since written, 60 s of 120 s held
    snapshot = b.apply_plan(snapshot, plan)
    plan = plan_cycle(snapshot)  # a fresh engine (nothing kept in memory) completes the 120 s
    assert len(straggler_annotations(plan)) == 8
    assert len(events(plan)) == 3
    plan = plan_cycle(b.apply_plan(snapshot, plan))
    assert events(plan) == []
