"""Hypothesis properties of whole cycles over random clusters, policies and annotations."""

import math
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_efficiency.api import names
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    EvictPod,
    GPUSample,
    PodRef,
    PodView,
    Signal,
    Snapshot,
    Stats,
    TaintNode,
)
from gpu_efficiency.engine.planner import plan_cycle
from tests.unit.positive_control import reached

from . import builders as b
from .builders import NOW, gpu, pod, policy, snapshot, stats

GOOD_PROFILES = [
    b.idle,
    b.idle_holding_memory,
    b.compute_bound,
    b.fake_load,
    b.bursty_inference,
    b.memory_bound,
]
NAMESPACES = ["team-a", "team-b", "team-c", "kube-system", "gpu-efficiency-system"]
PROTECTED = frozenset({"kube-system", "gpu-efficiency-system"})
BAD_KINDS = ["missing", "nan", "sparse", "stale", "inf", "negative", "empty"]


def degrade(signals: dict[Signal, Stats], kind: str) -> dict[Signal, Stats]:
    """Break every activity signal the way a broken exporter or Prometheus would."""
    chain = (Signal.SM_ACTIVE, Signal.GR_ENGINE_ACTIVE, Signal.GPU_UTIL)
    if kind == "empty":
        return {}
    out = dict(signals)
    for signal in chain:
        if kind == "missing":
            out.pop(signal, None)
        elif kind == "nan":
            out[signal] = stats(math.nan, math.nan)
        elif kind == "sparse":
            out[signal] = stats(0.0, count=5)
        elif kind == "stale":
            out[signal] = stats(0.0, age=3600.0)
        elif kind == "inf":
            out[signal] = stats(0.0, math.inf)
        elif kind == "negative":
            out[signal] = stats(-1.0, 0.0)
    return out


@dataclass(frozen=True)
class PodSpec:
    namespace: str
    gpus: int
    profile: int
    bad: str | None  # how one of its GPUs' data is broken, if at all
    shared_with_previous: bool
    controller: str | None
    idle_minutes: int | None  # idle-since this long ago
    warned_minutes_ago: int | None  # evict-after this long ago (negative: in the future)
    age_minutes: int


# Biased towards idle, warned, evictable pods so that evictions actually happen and the
# properties have something to bound (a uniform draw almost never lines everything up).
pod_specs = st.builds(
    PodSpec,
    namespace=st.sampled_from(["team-a", "team-a", "team-b", "team-c", *sorted(PROTECTED)]),
    gpus=st.sampled_from([1, 1, 1, 2]),
    profile=st.sampled_from([0, 0, 0, 1, 1, 2, 3, 4, 5]),
    bad=st.none() | st.none() | st.sampled_from(BAD_KINDS),
    shared_with_previous=st.sampled_from([False, False, False, True]),
    controller=st.sampled_from(["ReplicaSet", "ReplicaSet", "StatefulSet", "Job", "DaemonSet", None]),
    idle_minutes=st.sampled_from([300, 60, 30, 10, 0, None]),
    warned_minutes_ago=st.sampled_from([60, 5, 0, -5, None]),
    age_minutes=st.sampled_from([600, 60, 11, 5, 0]),
)
# Idle, warned long ago, old enough, evictable: due for eviction unless its data is broken.
due_specs = st.builds(
    PodSpec,
    namespace=st.sampled_from(["team-a", "team-b", "team-c", *sorted(PROTECTED)]),
    gpus=st.sampled_from([1, 2]),
    profile=st.sampled_from([0, 1]),
    bad=st.none() | st.sampled_from(BAD_KINDS),
    shared_with_previous=st.booleans(),
    controller=st.just("ReplicaSet"),
    idle_minutes=st.just(300),
    warned_minutes_ago=st.just(60),
    age_minutes=st.just(600),
)
clusters = st.lists(due_specs | pod_specs, min_size=1, max_size=12)

policies = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["Enforce", "Enforce", "Observe"]),
        "idle": st.fixed_dictionaries(
            {
                "idle_for": st.sampled_from(["0s", "5m", "30m"]),
                "warning_period": st.sampled_from(["1s", "5m"]),  # Enforce needs a warning (CRD rule)
            }
        ),
        "eviction": st.fixed_dictionaries(
            {
                "max_per_cycle": st.sampled_from([3, 1, 2, 5, 0]),
                "max_per_hour": st.sampled_from([8, 3, 1, 0, 20]),
                "max_per_namespace_per_cycle": st.sampled_from([2, 1, 3, 0]),
                "allow_bare_pods": st.booleans(),
            }
        ),
    }
)


def build(
    specs: list[PodSpec], spec_fields: dict[str, Any], recent: int
) -> tuple[Snapshot, set[tuple[str, str]]]:
    """The snapshot and the pods that have at least one GPU with broken data."""
    samples: list[GPUSample] = []
    pods: list[PodView] = []
    broken: set[tuple[str, str]] = set()
    for i, s in enumerate(specs):
        key = (s.namespace, f"p{i}")
        owned: list[GPUSample] = []
        for j in range(s.gpus):
            signals = GOOD_PROFILES[s.profile]()
            if s.bad is not None and j == 0:
                signals = degrade(signals, s.bad)
                broken.add(key)
            owned.append(gpu(f"GPU-{i}-{j}", signals, key))
        if s.shared_with_previous and samples:  # co-tenant on the previous pod's first GPU
            prev = samples[-1]
            samples[-1] = replace(prev, pods=(*prev.pods, PodRef(key[0], key[1], "main")))
        samples.extend(owned)
        ann: dict[str, str] = {}
        if s.idle_minutes is not None:
            ann[names.IDLE_SINCE] = format_rfc3339(NOW - s.idle_minutes * 60)
        if s.warned_minutes_ago is not None:
            ann[names.EVICT_AFTER] = format_rfc3339(NOW - s.warned_minutes_ago * 60)
        pods.append(
            pod(
                key[1],
                key[0],
                annotations=ann,
                controller_kind=s.controller,
                start_time=NOW - s.age_minutes * 60,
                gpu_request=s.gpus,
            )
        )
    # a pod that shares a broken GPU inherits the doubt
    for sample in samples:
        if any((r.namespace, r.name) in broken for r in sample.pods):
            broken.update((r.namespace, r.name) for r in sample.pods)
    recent_times = [format_rfc3339(NOW - 60 * (k + 1)) for k in range(recent)]
    status = GPUEfficiencyPolicyStatus(recent_evictions=recent_times)
    return snapshot(samples, pods, policy(**spec_fields), status=status, protected=PROTECTED), broken


def evictions(snap: Snapshot) -> list[EvictPod]:
    return [a for a in plan_cycle(snap).actions if isinstance(a, EvictPod)]


@settings(max_examples=150, deadline=None)
@given(clusters, policies, st.sampled_from([0, 1, 2, 5, 8]))
def test_missing_nan_sparse_or_stale_data_never_yields_evict(
    specs: list[PodSpec], spec_fields: dict[str, Any], recent: int
) -> None:
    snap, broken = build(specs, spec_fields, recent)
    for evict in evictions(snap):
        assert (evict.namespace, evict.name) not in broken


@settings(max_examples=150, deadline=None)
@given(clusters, policies, st.sampled_from([0, 1, 2, 5, 8]))
def test_caps_are_never_exceeded(specs: list[PodSpec], spec_fields: dict[str, Any], recent: int) -> None:
    snap, _ = build(specs, spec_fields, recent)
    evicted = evictions(snap)
    caps = spec_fields["eviction"]
    assert len(evicted) <= caps["max_per_cycle"]
    assert len(evicted) <= max(0, caps["max_per_hour"] - recent)
    for namespace in NAMESPACES:
        assert sum(e.namespace == namespace for e in evicted) <= caps["max_per_namespace_per_cycle"]


@settings(max_examples=100, deadline=None)
@given(clusters, policies, st.integers(0, 3))
def test_observe_mode_never_destroys(specs: list[PodSpec], spec_fields: dict[str, Any], recent: int) -> None:
    snap, _ = build(specs, {**spec_fields, "mode": "Observe"}, recent)
    plan = plan_cycle(snap)
    assert not [a for a in plan.actions if isinstance(a, EvictPod | TaintNode)]
    for action in plan.actions:
        annotations = getattr(action, "annotations", {})
        assert annotations.get(names.EVICT_AFTER) is None  # never a new warning


@settings(max_examples=100, deadline=None)
@given(clusters, policies, st.integers(0, 3))
def test_protected_namespaces_get_no_action(
    specs: list[PodSpec], spec_fields: dict[str, Any], recent: int
) -> None:
    snap, _ = build(specs, spec_fields, recent)
    plan = plan_cycle(snap)
    for action in plan.actions:
        assert getattr(action, "namespace", None) not in PROTECTED
    assert not [v for v in plan.verdicts if v.namespace in PROTECTED]


# -- positive controls: the generator above reaches the cases the properties bound ----------------
# Each "never" above would also pass if plan_cycle never evicted anything. These search the same
# generator for an example where the rules do act, and fail when the generator never gets there.

cases = st.tuples(clusters, policies, st.sampled_from([0, 1, 2, 5, 8]))


def _repaired(specs: list[PodSpec]) -> list[PodSpec]:
    return [replace(s, bad=None) for s in specs]


def test_control_broken_pods_would_be_evicted_with_sound_data() -> None:
    """Broken data is what keeps a due pod: with its data repaired the same pod is evicted."""

    def broken_would_go(case: tuple[list[PodSpec], dict[str, Any], int]) -> bool:
        specs, spec_fields, recent = case
        _, broken = build(specs, spec_fields, recent)
        if not broken:
            return False
        sound, _ = build(_repaired(specs), spec_fields, recent)
        return any((e.namespace, e.name) in broken for e in evictions(sound))

    specs, spec_fields, recent = reached(cases, broken_would_go)
    snap, broken = build(specs, spec_fields, recent)
    assert not [e for e in evictions(snap) if (e.namespace, e.name) in broken]


def test_control_caps_bind() -> None:
    """The caps are what stop further evictions: lifted, the same snapshot evicts more."""
    lifted = {"max_per_cycle": 100, "max_per_hour": 100, "max_per_namespace_per_cycle": 100}

    def capped(case: tuple[list[PodSpec], dict[str, Any], int]) -> bool:
        specs, spec_fields, recent = case
        within = len(evictions(build(specs, spec_fields, recent)[0]))
        unbound = {**spec_fields, "eviction": {**spec_fields["eviction"], **lifted}}
        return 0 < within < len(evictions(build(specs, unbound, 0)[0]))

    reached(cases, capped)


def test_control_enforce_evicts_where_observe_does_not() -> None:
    def enforce_evicts(case: tuple[list[PodSpec], dict[str, Any], int]) -> bool:
        specs, spec_fields, recent = case
        return bool(evictions(build(specs, {**spec_fields, "mode": "Enforce"}, recent)[0]))

    specs, spec_fields, recent = reached(cases, enforce_evicts)
    observed, _ = build(specs, {**spec_fields, "mode": "Observe"}, recent)
    assert evictions(observed) == []


def test_control_protection_is_what_spares_protected_namespaces() -> None:
    """Unprotected, pods of the same namespaces are evicted."""

    def protected_pod_would_go(case: tuple[list[PodSpec], dict[str, Any], int]) -> bool:
        snap, _ = build(*case)
        exposed = replace(snap, protected_namespaces=frozenset())
        return any(e.namespace in PROTECTED for e in evictions(exposed))

    snap, _ = build(*reached(cases, protected_pod_would_go))
    assert not [e for e in evictions(snap) if e.namespace in PROTECTED]
