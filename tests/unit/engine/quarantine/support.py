"""Builders for fault-engine tests, and a tiny cluster that applies fault actions between cycles.

No tests here: healthy defaults for every fault window, knobs to inject faults and garbage, and
``Cluster`` playing the node actuator's part (taints merged as the real one merges them,
GPUHealthy keeping lastTransitionTime, annotations patched) so lifecycle tests feed each outcome
into the next snapshot, exactly as the operator does through the API server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_efficiency.actuators.nodes import with_kind, without_kind
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import Condition, GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    AnnotateNode,
    FaultOutcome,
    GPUSample,
    NodeCondition,
    NodeEvent,
    NodeView,
    PolicyEvent,
    SetNodeCondition,
    Signal,
    Snapshot,
    Stats,
    Taint,
    TaintNode,
    UntaintNode,
    Window,
)
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults

NOW = 1_700_000_000.0
FULL = {Window.FAULT: 8, Window.THERMAL_HOLD: 8, Window.THERMAL_RECOVERY: 20}  # defaults: 2m, 2m, 5m
NAN = math.nan


def st(
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    first: float | None = None,
    count: int = 8,
    age: float = 5.0,
    changes: int = 0,
    resets: int = 0,
    now: float = NOW,
) -> Stats:
    """Stats whose newest value is ``value``; min/max default to it."""
    lo = value if low is None else low
    hi = value if high is None else high
    return Stats(
        avg=(lo + hi) / 2,
        max=hi,
        min=lo,
        last=value,
        count=count,
        last_timestamp=now - age,
        changes=changes,
        resets=resets,
        first=first,
    )


def counter(start: float, end: float, **kw: Any) -> Stats:
    """A clean counter going from ``start`` to ``end`` within the window."""
    return st(end, low=start, high=end, first=start, **kw)


def healthy_fault(now: float = NOW) -> dict[Signal, Stats]:
    return {
        Signal.ECC_DBE_VOLATILE: counter(0, 0, now=now),
        Signal.REMAPPED_ROWS_UNCORRECTABLE: counter(0, 0, now=now),
        Signal.ROW_REMAP_FAILURE: st(0, now=now),
        Signal.RETIRED_PAGES_PENDING: st(0, now=now),
        Signal.XID: st(0, now=now),
    }


def healthy_hold(now: float = NOW) -> dict[Signal, Stats]:
    return {
        Signal.GPU_TEMP: st(60, low=55, high=65, now=now),
        Signal.MEMORY_TEMP: st(70, low=65, high=72, now=now),
        Signal.CLOCK_EVENTS: st(0, now=now),
    }


def healthy_recovery(now: float = NOW) -> dict[Signal, Stats]:
    return {k: replace(v, count=20) for k, v in healthy_hold(now).items()}


def gpu(
    node: str,
    index: int = 0,
    *,
    fault: Mapping[Signal, Stats | None] | None = None,
    hold: Mapping[Signal, Stats | None] | None = None,
    recovery: Mapping[Signal, Stats | None] | None = None,
    now: float = NOW,
    source: str = "prometheus",
) -> GPUSample:
    """A GPU with healthy readings in every fault window; the mappings replace (None removes) signals."""

    def merged(base: dict[Signal, Stats], extra: Mapping[Signal, Stats | None] | None) -> dict[Signal, Stats]:
        for signal, value in (extra or {}).items():
            if value is None:
                base.pop(signal, None)
            else:
                base[signal] = value
        return base

    return GPUSample(
        node=node,
        uuid=f"GPU-{node}-{index}",
        index=str(index),
        model="NVIDIA H100 80GB HBM3",
        pods=(),
        stats={
            Window.FAULT: merged(healthy_fault(now), fault),
            Window.THERMAL_HOLD: merged(healthy_hold(now), hold),
            Window.THERMAL_RECOVERY: merged(healthy_recovery(now), recovery),
        },
        source=source,
        expected_samples=dict(FULL),
    )


DBE_ERROR = {Signal.ECC_DBE_VOLATILE: counter(0, 1)}
XID_79 = {Signal.XID: st(79, low=0, high=79, changes=1)}
HOT = {Signal.GPU_TEMP: st(95, low=93, high=97)}
HOT_RECOVERY = {Signal.GPU_TEMP: st(95, low=60, high=97, count=20)}


def shifted(sample: GPUSample, delta: float) -> GPUSample:
    """The GPU as seen ``delta`` seconds later: same readings, timestamps moved along."""
    stats = {
        window: {sig: replace(s, last_timestamp=s.last_timestamp + delta) for sig, s in by_signal.items()}
        for window, by_signal in sample.stats.items()
    }
    witness = shifted(sample.witness, delta) if sample.witness is not None else None
    return replace(sample, stats=stats, witness=witness)


def policy(mode: str = "Enforce", **faults: Any) -> GPUEfficiencyPolicySpec:
    return GPUEfficiencyPolicySpec.model_validate({"mode": mode, "faults": faults})


def node(
    name: str,
    *,
    gpus: int = 8,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
    conditions: Iterable[NodeCondition] = (),
) -> NodeView:
    return NodeView(
        name=name,
        labels=dict(labels or {}),
        annotations=dict(annotations or {}),
        taints=tuple(taints),
        conditions=tuple(conditions),
        gpu_capacity=gpus,
    )


def snapshot(
    nodes: Iterable[NodeView],
    gpus: Iterable[GPUSample],
    *,
    spec: GPUEfficiencyPolicySpec | None = None,
    now: float = NOW,
    conditions: Iterable[Condition] = (),
    metrics_available: bool = True,
) -> Snapshot:
    return Snapshot(
        now=now,
        policy_name="gpu",
        policy=spec or policy(),
        status=GPUEfficiencyPolicyStatus(conditions=list(conditions)),
        generation=1,
        gpus=tuple(gpus),
        pods=(),
        nodes=tuple(nodes),
        namespaces=(),
        metrics_available=metrics_available,
        metrics_error="" if metrics_available else "prometheus down",
    )


def of_type(actions: Iterable[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def reasons(actions: Iterable[Action]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, NodeEvent | PolicyEvent)]


def writes(actions: Iterable[Action]) -> list[Action]:
    """Actions that change the cluster (events excluded)."""
    return [a for a in actions if not isinstance(a, NodeEvent | PolicyEvent)]


def record_of(view: NodeView) -> dict[str, Any]:
    import json

    text = view.annotations.get(names.NODE_FAULTS)
    return json.loads(text) if text else {}


@dataclass
class Cluster:
    """Nodes plus the policy's breaker condition, evolved by applying each outcome's actions."""

    nodes: dict[str, NodeView]
    spec: GPUEfficiencyPolicySpec = field(default_factory=policy)
    breaker: Condition | None = None
    now: float = NOW

    @classmethod
    def of(cls, *views: NodeView, spec: GPUEfficiencyPolicySpec | None = None) -> Cluster:
        return cls({v.name: v for v in views}, spec or policy())

    def cycle(
        self, gpus: Iterable[GPUSample], *, advance: float = 60.0, metrics_available: bool = True
    ) -> FaultOutcome:
        """Evaluate at the current time, apply the outcome, then move the clock by ``advance``."""
        conditions = [self.breaker] if self.breaker is not None else []
        snap = snapshot(
            self.nodes.values(),
            [shifted(g, self.now - NOW) for g in gpus],
            spec=self.spec,
            now=self.now,
            conditions=conditions,
            metrics_available=metrics_available,
        )
        outcome = evaluate_faults(snap)
        self.apply(outcome.actions)
        self.breaker = Condition(
            type=names.COND_BREAKER,
            status="True" if outcome.breaker_open else "False",
            message=outcome.breaker_message,
        )
        self.now += advance
        return outcome

    def apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, TaintNode | UntaintNode):
                self._taint(action)
            elif isinstance(action, SetNodeCondition):
                self._condition(action)
            elif isinstance(action, AnnotateNode):
                view = self.nodes[action.node]
                annotations = dict(view.annotations)
                for key, value in action.annotations.items():
                    if value is None:
                        annotations.pop(key, None)
                    else:
                        annotations[key] = value
                self.nodes[action.node] = replace(view, annotations=annotations)

    def _taint(self, action: TaintNode | UntaintNode) -> None:
        view = self.nodes[action.node]
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in view.taints]
        if isinstance(action, TaintNode):
            changed = with_kind(taints, action.kind, action.effect, self.now)
        else:
            changed = without_kind(taints, action.kind)
        if changed is not None:
            new = tuple(Taint(t["key"], t.get("value", ""), t["effect"]) for t in changed)
            self.nodes[action.node] = replace(view, taints=new)

    def _condition(self, action: SetNodeCondition) -> None:
        view = self.nodes[action.node]
        old = next((c for c in view.conditions if c.type == action.type), None)
        keep = old is not None and old.status == action.status
        condition = NodeCondition(
            type=action.type,
            status=action.status,
            reason=action.reason,
            message=action.message,
            last_transition_time=old.last_transition_time if old and keep else format_rfc3339(self.now),
        )
        others = tuple(c for c in view.conditions if c.type != action.type)
        self.nodes[action.node] = replace(view, conditions=(*others, condition))

    # -- what an admin does -------------------------------------------------------------------

    def annotate(self, name: str, key: str, value: str) -> None:
        view = self.nodes[name]
        self.nodes[name] = replace(view, annotations={**view.annotations, key: value})

    def remove_taints(self, name: str, key: str = names.FAULT_TAINT_KEY) -> None:
        view = self.nodes[name]
        self.nodes[name] = replace(view, taints=tuple(t for t in view.taints if t.key != key))

    def our_taint_values(self, name: str) -> list[str]:
        return sorted(
            f"{t.value}:{t.effect}" for t in self.nodes[name].taints if t.key == names.FAULT_TAINT_KEY
        )

    def maybe_condition(self, name: str, type_: str = names.GPU_HEALTHY) -> NodeCondition | None:
        return next((c for c in self.nodes[name].conditions if c.type == type_), None)

    def condition(self, name: str) -> NodeCondition:
        condition = self.maybe_condition(name)
        assert condition is not None, f"{name} has no {names.GPU_HEALTHY} condition"
        return condition

    def tainted_nodes(self) -> set[str]:
        return {n for n, v in self.nodes.items() if any(t.key == names.FAULT_TAINT_KEY for t in v.taints)}
