"""Plain-data builders for engine tests: stats, GPU samples, pods, policies, snapshots.

``apply_plan`` plays the actuator's part between cycles (annotations patched, evicted pods gone,
evictions recorded in status), so lifecycle tests can feed each plan into the next snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import pytest

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine import planner
from gpu_efficiency.engine.model import (
    AnnotatePod,
    EvictPod,
    FaultOutcome,
    GPUSample,
    NamespaceView,
    NodeView,
    Plan,
    PodRef,
    PodView,
    Signal,
    Snapshot,
    Stats,
    Window,
)

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NO_FAULTS = FaultOutcome(actions=(), quarantined=(), breaker_open=False)


@pytest.fixture
def no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod-engine tests see the plan without the faults engine's node actions (tested on its own)."""
    monkeypatch.setattr(planner, "evaluate_faults", lambda snapshot, stragglers=(), params=None: NO_FAULTS)


EXPECTED = 40.0  # 10m window / 15s scrape
H100 = "NVIDIA H100 80GB HBM3"
FB_TOTAL = 81559.0


def stats(
    avg: float,
    peak: float | None = None,
    *,
    count: int = 40,
    age: float = 10.0,
    stddev: float = 0.0,
    last: float | None = None,
    low: float | None = None,
    now: float = NOW,
) -> Stats:
    """Stats of one signal: ``peak`` defaults to ``avg``, the newest sample ``age`` seconds old."""
    peak = avg if peak is None else peak
    return Stats(
        avg=avg,
        max=peak,
        min=avg if low is None else low,
        last=avg if last is None else last,
        count=count,
        last_timestamp=now - age,
        stddev=stddev,
    )


# ---- signal profiles (activity window), named after the scenario profiles -------------------------


def compute_bound() -> dict[Signal, Stats]:
    return {
        Signal.SM_ACTIVE: stats(0.85, 0.95),
        Signal.GR_ENGINE_ACTIVE: stats(0.9, 0.98),
        Signal.GPU_UTIL: stats(98.0, 100.0, stddev=2.0),
        Signal.SM_OCCUPANCY: stats(0.55),
        Signal.TENSOR_ACTIVE: stats(0.45),
        Signal.DRAM_ACTIVE: stats(0.4),
        Signal.PCIE_RX_BYTES: stats(2e8, 4e8),
        Signal.FB_USED: stats(40000.0),
        Signal.FB_FREE: stats(FB_TOTAL - 40000.0),
        Signal.POWER: stats(600.0, 680.0, stddev=20.0),
        Signal.GPU_TEMP: stats(70.0, 74.0),
        Signal.CLOCK_EVENTS: stats(0.0),
    }


def idle() -> dict[Signal, Stats]:
    return {
        Signal.SM_ACTIVE: stats(0.0, 0.001),
        Signal.GR_ENGINE_ACTIVE: stats(0.0, 0.002),
        Signal.GPU_UTIL: stats(0.0, 0.0),
        Signal.SM_OCCUPANCY: stats(0.0),
        Signal.TENSOR_ACTIVE: stats(0.0),
        Signal.DRAM_ACTIVE: stats(0.0),
        Signal.FB_USED: stats(0.0),
        Signal.FB_FREE: stats(FB_TOTAL),
        Signal.POWER: stats(70.0),
        Signal.GPU_TEMP: stats(35.0),
        Signal.CLOCK_EVENTS: stats(1.0),  # GPU_IDLE bit
    }


def idle_holding_memory() -> dict[Signal, Stats]:
    return idle() | {Signal.FB_USED: stats(60000.0), Signal.FB_FREE: stats(FB_TOTAL - 60000.0)}


def low_activity(**extra: Stats) -> dict[Signal, Stats]:
    """SM activity 0.15 with moderate GPU_UTIL: the base of the low-SM diagnoses.

    Keywords are Signal names (``GPU_UTIL=stats(100.0)``) that replace or add readings.
    """
    base = {
        Signal.SM_ACTIVE: stats(0.15, 0.3),
        Signal.GR_ENGINE_ACTIVE: stats(0.2, 0.35),
        Signal.GPU_UTIL: stats(50.0, 70.0, stddev=5.0),
        Signal.SM_OCCUPANCY: stats(0.3),
        Signal.TENSOR_ACTIVE: stats(0.1),
        Signal.DRAM_ACTIVE: stats(0.3),
        Signal.PCIE_RX_BYTES: stats(1e8, 2e8),
        Signal.FB_USED: stats(30000.0),
        Signal.FB_FREE: stats(FB_TOTAL - 30000.0),
        Signal.POWER: stats(250.0, stddev=10.0),
        Signal.GPU_TEMP: stats(55.0),
        Signal.CLOCK_EVENTS: stats(0.0),
    }
    return base | {Signal[name]: value for name, value in extra.items()}


def fake_load() -> dict[Signal, Stats]:
    return low_activity(
        SM_ACTIVE=stats(0.05, 0.08), GPU_UTIL=stats(100.0, 100.0), GR_ENGINE_ACTIVE=stats(0.06, 0.1)
    )


def memory_bound() -> dict[Signal, Stats]:
    return low_activity(DRAM_ACTIVE=stats(0.9, 0.95), GPU_UTIL=stats(100.0))


def input_starved() -> dict[Signal, Stats]:
    return low_activity(GPU_UTIL=stats(45.0, 100.0, stddev=35.0), PCIE_RX_BYTES=stats(1e9, 1.2e10))


def communication_bound() -> dict[Signal, Stats]:
    return low_activity(
        NVLINK_RX_BYTES=stats(4e9, 8e9), NVLINK_TX_BYTES=stats(4e9, 8e9), GPU_UTIL=stats(95.0)
    )


def low_occupancy() -> dict[Signal, Stats]:
    return compute_bound() | {Signal.SM_ACTIVE: stats(0.7, 0.8), Signal.SM_OCCUPANCY: stats(0.1)}


def no_tensor_cores() -> dict[Signal, Stats]:
    return compute_bound() | {Signal.SM_ACTIVE: stats(0.5, 0.6), Signal.TENSOR_ACTIVE: stats(0.0)}


def thermal_throttled() -> dict[Signal, Stats]:
    return compute_bound() | {Signal.CLOCK_EVENTS: stats(0x40), Signal.GPU_TEMP: stats(89.0, 92.0)}


def bursty_inference() -> dict[Signal, Stats]:
    """Mostly quiet, with short bursts: the peak keeps it from ever being called idle."""
    return low_activity(
        SM_ACTIVE=stats(0.03, 0.6), GR_ENGINE_ACTIVE=stats(0.04, 0.65), GPU_UTIL=stats(10.0, 100.0)
    )


# ---- samples, pods, nodes, policies, snapshots ----------------------------------------------------


def gpu(
    uuid: str,
    signals: Mapping[Signal, Stats],
    *pods: tuple[str, str],
    node: str = "node-0",
    model: str = H100,
    expected: float | None = EXPECTED,
    fb_total_mib: float | None = FB_TOTAL,
) -> GPUSample:
    """A GPU sample attributed to ``pods`` given as (namespace, name)."""
    return GPUSample(
        node=node,
        uuid=uuid,
        index=uuid.rsplit("-", 1)[-1],
        model=model,
        pods=tuple(PodRef(ns, name, "main") for ns, name in pods),
        stats={Window.ACTIVITY: dict(signals)},
        expected_samples={} if expected is None else {Window.ACTIVITY: expected},
        fb_total_mib=fb_total_mib,
    )


def pod(
    name: str,
    namespace: str = "team-a",
    *,
    node: str = "node-0",
    annotations: Mapping[str, str] | None = None,
    controller_kind: str | None = "ReplicaSet",
    priority: int = 0,
    start_time: float | None = NOW - 86400,
    gpu_request: int = 1,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    is_static: bool = False,
    deleting: bool = False,
) -> PodView:
    return PodView(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        node=node,
        phase=phase,
        labels=dict(labels or {}),
        annotations=dict(annotations or {}),
        controller_kind=controller_kind,
        priority=priority,
        start_time=start_time,
        gpu_request=gpu_request,
        is_static=is_static,
        deleting=deleting,
    )


def node(name: str = "node-0", labels: Mapping[str, str] | None = None) -> NodeView:
    return NodeView(
        name=name, labels=dict(labels or {}), annotations={}, taints=(), conditions=(), gpu_capacity=8
    )


def policy(**fields: Any) -> GPUEfficiencyPolicySpec:
    """A spec from python-named fields, nested as dicts: ``policy(idle={"idle_for": "5m"})``."""
    return GPUEfficiencyPolicySpec.model_validate(fields)


def enforce(**fields: Any) -> GPUEfficiencyPolicySpec:
    """Enforce mode with short clocks (idle 5m, warning 5m) and generous budgets unless overridden."""
    base: dict[str, Any] = {
        "mode": "Enforce",
        "idle": {"idle_for": "5m", "warning_period": "5m"},
        "eviction": {"max_per_cycle": 100, "max_per_hour": 1000, "max_per_namespace_per_cycle": 100},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = base[key] | value
        else:
            base[key] = value
    return policy(**base)


def snapshot(
    gpus: Iterable[GPUSample],
    pods: Iterable[PodView],
    spec: GPUEfficiencyPolicySpec | None = None,
    *,
    now: float = NOW,
    status: GPUEfficiencyPolicyStatus | None = None,
    nodes: Iterable[NodeView] | None = None,
    namespaces: Iterable[NamespaceView] = (),
    metrics_available: bool = True,
    metrics_error: str = "",
    protected: frozenset[str] = frozenset({"kube-system", "gpu-efficiency-system"}),
    dropped: Mapping[str, int] | None = None,
) -> Snapshot:
    gpus = tuple(gpus)
    if nodes is None:
        nodes = [node(n) for n in sorted({g.node for g in gpus} | {"node-0"})]
    return Snapshot(
        now=now,
        policy_name="test-policy",
        policy=spec or policy(),
        status=status or GPUEfficiencyPolicyStatus(),
        generation=1,
        gpus=gpus,
        pods=tuple(pods),
        nodes=tuple(nodes),
        namespaces=tuple(namespaces),
        metrics_available=metrics_available,
        metrics_error=metrics_error,
        protected_namespaces=protected,
        dropped_samples=dict(dropped or {}),
    )


def shift_stats(sample: GPUSample, now: float) -> GPUSample:
    """The same readings, re-timed so the newest sample is taken at ``now`` (the lifecycle tests step a
    minute at a time; a source whose newest sample lags the cycle is tested in test_fresh_evidence)."""
    windows = {
        window: {signal: replace(s, last_timestamp=now) for signal, s in signals.items()}
        for window, signals in sample.stats.items()
    }
    return replace(sample, stats=windows)


def apply_plan(snap: Snapshot, plan: Plan, *, advance: float = 60.0) -> Snapshot:
    """The next cycle's snapshot after an actuator applied ``plan`` perfectly, ``advance`` seconds later."""
    pods = {(p.namespace, p.name): p for p in snap.pods}
    recent = list(plan.status.recent_evictions)
    evictions = plan.status.evictions_total
    for action in plan.actions:
        key = (getattr(action, "namespace", ""), getattr(action, "name", ""))
        if isinstance(action, AnnotatePod) and key in pods:
            merged = dict(pods[key].annotations)
            for k, v in action.annotations.items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
            pods[key] = replace(pods[key], annotations=merged)
        elif isinstance(action, EvictPod) and key in pods:
            del pods[key]
            recent.append(format_rfc3339(snap.now))
            evictions += 1
    now = snap.now + advance
    status = plan.status.model_copy(update={"recent_evictions": recent, "evictions_total": evictions})
    return replace(
        snap,
        now=now,
        pods=tuple(pods.values()),
        gpus=tuple(shift_stats(g, now) for g in snap.gpus),
        status=status,
    )


def with_signals(snap: Snapshot, uuid: str, signals: Mapping[Signal, Stats]) -> Snapshot:
    """Replace one GPU's activity-window readings (fresh at the snapshot's time)."""
    gpus = tuple(
        shift_stats(replace(g, stats={Window.ACTIVITY: dict(signals)}), snap.now) if g.uuid == uuid else g
        for g in snap.gpus
    )
    return replace(snap, gpus=gpus)


def annotations_of(snap: Snapshot, namespace: str, name: str) -> Mapping[str, str]:
    for p in snap.pods:
        if (p.namespace, p.name) == (namespace, name):
            return p.annotations
    raise KeyError(f"{namespace}/{name}")
