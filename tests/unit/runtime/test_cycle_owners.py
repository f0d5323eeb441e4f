"""A cycle reads the pods' owners only when an in-scope pod is warned or due (else the last read, or
none while no clock runs), and says when it cannot."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.engine import owner_builders as ob
from tests.unit.runtime import cycle_harness as h

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.engine.model import AnnotatePod, PodEvent
from gpu_efficiency.runtime.cycle import CycleRunner
from gpu_efficiency.runtime.observe import OWNER_CACHE_SECONDS
from gpu_efficiency.sources.kube.cluster import ClusterState, pod_view
from gpu_efficiency.sources.kube.owners import OwnerState, OwnersUnavailable
from gpu_efficiency.sources.metrics.base import StaticSource


class StubOwners:
    """An owner source: ``reads`` counts its LISTs; ``watched``: what its watch keeps (None: none)."""

    def __init__(self, fail: bool = False, watched: OwnerState | None = None) -> None:
        self.reads = 0
        self.fail = fail
        self.watched = watched

    def read(self) -> OwnerState:
        self.reads += 1
        if self.fail:
            raise OwnersUnavailable("listing deployments: HTTP 403 Forbidden")
        return OwnerState({}, {}, requests=5)

    def current(self) -> OwnerState | None:
        return self.watched


NOW = 1_800_000_000.0
SPEC = GPUEfficiencyPolicySpec.model_validate({"idle": {"idleFor": "10m", "warningPeriod": "5m"}})
ENFORCE = GPUEfficiencyPolicySpec.model_validate(
    {"mode": "Enforce", "idle": {"idleFor": "10m", "warningPeriod": "5m"}}
)
OPTING_OUT = GPUEfficiencyPolicySpec.model_validate(
    {"mode": "Enforce", "idle": {"idleFor": "10m", "warningPeriod": "5m", "allowOptOut": True}}
)
DEPLOYMENT_POD = {"kind": "ReplicaSet", "name": "trainer-7d9", "controller": True, "uid": "rs-1"}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def runner(owners: Any, clock: Clock | None = None) -> CycleRunner:
    return CycleRunner(
        clock=clock or Clock(),
        config=OperatorConfig(),
        reader=None,
        applier=None,
        status_writer=None,
        source_for=None,
        leader=None,
        owners=owners,  # type: ignore[arg-type]
    )


def cluster(*annotations: dict[str, str], owner: dict[str, Any] | None = DEPLOYMENT_POD) -> ClusterState:
    """GPU pods of a Deployment's ReplicaSet (``owner``; None: bare pods) with these annotations."""
    pods = tuple(
        pod_view(
            {
                "metadata": {
                    "name": f"p{i}",
                    "namespace": "ml",
                    "annotations": a,
                    "ownerReferences": [owner] if owner else [],
                },
                "spec": {
                    "nodeName": "n1",
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
        )
        for i, a in enumerate(annotations)
    )
    return ClusterState(pods=pods, nodes=(), namespaces=(), requests=0)


def test_owners_are_read_only_when_some_pod_is_idle() -> None:
    owners = StubOwners()
    assert runner(owners)._read_owners(cluster({}, {names.STATE: "Efficient"}), SPEC) == (None, "")
    assert owners.reads == 0
    state, error = runner(owners)._read_owners(cluster({}, {names.IDLE_SINCE: "2026-01-01T00:00:00Z"}), SPEC)
    assert state is not None
    assert (owners.reads, error) == (1, "")


def test_owners_unreadable_is_reported_not_raised() -> None:
    state, error = runner(StubOwners(fail=True))._read_owners(
        cluster({names.IDLE_SINCE: "2026-01-01T00:00:00Z"}), SPEC
    )
    assert state is None
    assert "HTTP 403" in error


def test_without_an_owner_reader_nothing_is_read() -> None:
    assert runner(None)._read_owners(cluster({names.IDLE_SINCE: "2026-01-01T00:00:00Z"}), SPEC) == (None, "")


def test_report_reads_owners_before_any_clock_runs() -> None:
    owners = StubOwners()
    one_shot = runner(owners)
    one_shot.read_owners_always = True
    state, _ = one_shot._read_owners(cluster({}), SPEC)
    assert state is not None
    assert owners.reads == 1


def test_between_warning_and_deadline_the_last_read_serves_and_costs_no_request() -> None:
    """A steady cluster costs no API reads: while pods are idle but nobody is warned or due this
    cycle, the owners read at the warning serve (for up to OWNER_CACHE_SECONDS); the cycle that
    acts reads them afresh."""
    owners, clock = StubOwners(), Clock()
    run = runner(owners, clock)
    idle_since = format_rfc3339(NOW - 3600)
    warning_due = cluster({names.IDLE_SINCE: idle_since})  # idle for an hour, idleFor 10m, no warning yet
    state, _ = run._read_owners(warning_due, ENFORCE)
    assert (owners.reads, state is not None and state.requests) == (1, 5)
    clock.now += 30  # still not warned (a failed write, say): the warning reads afresh again
    run._read_owners(warning_due, ENFORCE)
    assert owners.reads == 2
    warned = cluster({names.IDLE_SINCE: idle_since, names.EVICT_AFTER: format_rfc3339(NOW + 300)})
    for _ in range(5):
        clock.now += 30
        state, _ = run._read_owners(warned, ENFORCE)
        assert state is not None
        assert state.requests == 0
    assert owners.reads == 2
    clock.now = NOW + 300  # the deadline is reached (the last read is 270 s old): today's owners
    state, _ = run._read_owners(warned, ENFORCE)
    assert (owners.reads, state is not None and state.requests) == (3, 5)


@pytest.mark.parametrize(
    ("why", "spec", "annotations", "owner"),
    [
        ("Observe mode never warns", SPEC, {}, DEPLOYMENT_POD),
        ("a bare pod is never evicted (allowBarePods false)", ENFORCE, {}, None),
        ("opted out with exempt=true", OPTING_OUT, {names.EXEMPT: "true"}, DEPLOYMENT_POD),
    ],
)
def test_a_pod_that_can_never_be_warned_is_not_read_afresh_every_cycle_past_idle_for(
    why: str, spec: GPUEfficiencyPolicySpec, annotations: dict[str, str], owner: dict[str, Any] | None
) -> None:
    """Idle for an hour (idleFor 10m) and never warned: the owners only shape its annotation texts,
    so the last read serves. Before, every such cycle LISTed the owners for a warning that could not
    come (7 LISTs a cycle, and 8 discovery GETs once a minute, in the 300-node benchmark)."""
    owners, clock = StubOwners(), Clock()
    run = runner(owners, clock)
    idle = cluster({names.IDLE_SINCE: format_rfc3339(NOW - 3600), **annotations}, owner=owner)
    for _ in range(9):
        state, _ = run._read_owners(idle, spec)
        assert state is not None, why  # the texts still get the owners
        clock.now += 30
    assert owners.reads == 1, why
    clock.now = NOW + OWNER_CACHE_SECONDS + 1  # the last read grew too old even for texts
    run._read_owners(idle, spec)
    assert owners.reads == 2, why


def test_a_young_idle_clock_reads_nothing_until_the_cache_is_needed_and_too_old() -> None:
    owners, clock = StubOwners(), Clock()
    run = runner(owners, clock)
    young = cluster({names.IDLE_SINCE: format_rfc3339(NOW - 60)})  # idle a minute, idleFor 10m
    state, _ = run._read_owners(young, SPEC)
    assert state is not None
    assert owners.reads == 1
    clock.now += OWNER_CACHE_SECONDS - 1
    run._read_owners(young, SPEC)
    assert owners.reads == 1
    clock.now += 2
    run._read_owners(cluster({names.IDLE_SINCE: format_rfc3339(clock.now - 60)}), SPEC)
    assert owners.reads == 2


def test_pods_out_of_scope_never_cause_a_read() -> None:
    owners = StubOwners()
    other = GPUEfficiencyPolicySpec.model_validate(
        {"selection": {"excludedNamespaces": ["ml"]}, "idle": {"idleFor": "10m", "warningPeriod": "5m"}}
    )
    due = cluster({names.IDLE_SINCE: format_rfc3339(NOW - 7200), names.EVICT_AFTER: format_rfc3339(NOW - 60)})
    assert runner(owners)._read_owners(due, other) == (None, "")
    assert owners.reads == 0


def _annotated(pod: Any, actions: list[Any]) -> Any:
    merged = dict(pod.annotations)
    for action in actions:
        if isinstance(action, AnnotatePod) and action.name == pod.name:
            merged.update(action.annotations)
    return replace(pod, annotations={k: v for k, v in merged.items() if v is not None})


@pytest.mark.parametrize("mode", ["Observe", "Enforce"])
def test_a_pod_turning_idle_gets_its_owners_recommendation_at_once_and_the_next_cycle_writes_nothing(
    mode: str,
) -> None:
    """At 8,000 pods every newly idle bare pod was patched twice (and got a ReclaimSkipped event):
    the cycle that started its clock had not read the owners, the next one had and rewrote the
    recommendation. The cycle that starts a clock now reads them first, so a steady idle pod costs
    nothing after it."""
    idle_pod = h.b.pod("lonely", controller_kind=None)  # a bare pod: never reclaimed (allowBarePods false)
    gpu = h.b.gpu("GPU-lonely-0", h.b.idle(), ("team-a", "lonely"))
    run = h.runner([gpu], [idle_pod])
    owners, clock = StubOwners(), Clock()
    clock.now = h.b.NOW
    run.owners, run.clock = owners, clock  # type: ignore[assignment]
    spec = {**h.ENFORCE_SPEC, "mode": mode}
    h.run_cycle(run, spec=spec)
    applier: Any = run.applier
    first = list(applier.applied)
    patches = [a for a in first if isinstance(a, AnnotatePod)]
    assert len(patches) == 1
    assert owners.reads == 1
    assert patches[0].annotations[names.STATE] == "Idle"
    assert "of pod/lonely" in str(patches[0].annotations[names.RECOMMENDATION])  # the owner's text
    reasons = sorted(a.reason for a in first if isinstance(a, PodEvent))
    # Observe reclaims nothing, so nothing is "skipped"; no clock reads as tampered with although the
    # cycle judged twice (the first judgement's clocks are not remembered)
    assert reasons == ([names.EV_IDLE, names.EV_RECLAIM_SKIPPED] if mode == "Enforce" else [names.EV_IDLE])

    clock.now += 30
    run.reader = h.MemoryReader([_annotated(idle_pod, first)], run.reader.nodes)  # type: ignore[attr-defined]
    run.source_for = h.OneSource(StaticSource([h.b.shift_stats(gpu, clock.now)]))
    applier.applied.clear()
    h.run_cycle(run, spec=spec)
    assert [a for a in applier.applied if getattr(a, "name", "") == "lonely"] == []


class SwitchingOwners:
    """One Job, read as it is now: ``suspended`` flips when the test says our suspend landed."""

    def __init__(self) -> None:
        self.suspended = False
        self.reads = 0

    def read(self) -> OwnerState:
        self.reads += 1
        job = ob.obj("Job", "train", replicas=None, suspended=self.suspended)
        return OwnerState({("team-a", "Job", "train"): job}, {}, requests=5)


def test_the_cycle_after_a_reclaim_does_not_judge_the_owner_by_the_read_made_before_it() -> None:
    """The owners read by the cycle that suspended a Job show it running. Served from the cache to
    the next cycle (another pod's idle clock runs, nobody is due), that read ended the new record
    as if the Job had been restored, and `gpu-efficiency restore` then refused the Job for want of a
    record (seen in the crd-owners e2e). A reclaiming cycle drops the cache: the next one reads."""
    due = {
        names.STATE: "Warned",
        names.IDLE_SINCE: format_rfc3339(h.b.NOW - 7200),
        names.EVICT_AFTER: format_rfc3339(h.b.NOW - 3600),
    }
    train = ob.owned("train-x", ("Job", "train"), annotations=due)
    ticking = h.b.pod(
        "other", controller_kind=None, annotations={names.IDLE_SINCE: format_rfc3339(h.b.NOW - 60)}
    )
    gpus = [
        h.b.gpu("GPU-train", h.b.idle(), ("team-a", "train-x")),
        h.b.gpu("GPU-other", h.b.idle(), ("team-a", "other")),
    ]
    run = h.runner(gpus, [train, ticking])
    owners, clock = SwitchingOwners(), Clock()
    clock.now = h.b.NOW
    run.owners, run.clock = owners, clock  # type: ignore[assignment]
    h.run_cycle(run)
    writer: Any = run.status_writer
    records = writer.written["truth"].reclamations
    assert [(r.owner, r.action, r.returned) for r in records] == [("team-a/Job/train", "Suspend", True)]

    owners.suspended = True  # our suspend landed; the Job controller deleted the pod
    clock.now += 30
    run.reader = h.MemoryReader([ticking], run.reader.nodes)  # type: ignore[attr-defined]
    run.source_for = h.OneSource(StaticSource([h.b.shift_stats(g, clock.now) for g in gpus[1:]]))
    h.run_cycle(run)
    records = writer.written["truth"].reclamations
    assert [(r.owner, r.returned) for r in records] == [("team-a/Job/train", True)]
    assert owners.reads == 2


def test_watched_owners_serve_every_cycle_between_lists_and_never_a_warning_or_a_due_pod() -> None:
    """With the owners watched (``sources/kube/owner_cache.py``), a cycle that needs only the last
    read makes no request however old that read is (it re-LISTed every OWNER_CACHE_SECONDS);
    the first read, a warning, a due pod and the cycle after a reclaim still LIST."""
    watched = OwnerState({}, {("ml", "Deployment", "web"): "web-hpa"}, requests=0)
    owners, clock = StubOwners(watched=watched), Clock()
    run = runner(owners, clock)
    idle = cluster({names.IDLE_SINCE: format_rfc3339(NOW - 3600)})  # Observe: never warned
    state, _ = run._read_owners(idle, SPEC)
    assert (owners.reads, state) == (1, OwnerState({}, {}, requests=5))  # the first read LISTs
    for _ in range(30):  # 15 minutes of cycles
        clock.now += 30
        state, _ = run._read_owners(idle, SPEC)
        assert state is watched
    assert owners.reads == 1
    run._owner_cache = None  # what a reclaim does: the next read must show our own write
    run._read_owners(idle, SPEC)
    assert owners.reads == 2
    due = cluster(
        {names.IDLE_SINCE: format_rfc3339(NOW - 3600), names.EVICT_AFTER: format_rfc3339(clock.now - 1)}
    )
    state, _ = run._read_owners(due, ENFORCE)
    assert (owners.reads, state is not None and state.requests) == (3, 5)  # an action: LIST
