"""Judging a scenario's expectations against observations, each with its own deadline.

``check`` is pure: one expectation against one observation (plus the pod histories). ``Tracker``
adds time: an ordinary expectation passes at the first observation where it holds before its
deadline; a held one fails at the first observation where it does not, and passes at the deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_efficiency.api.durations import format_duration
from gpu_efficiency_sim.observation import JSON, Observation, WorkloadHistory, current_pods
from gpu_efficiency_sim.scenario import (
    CurrentPods,
    EventCheck,
    Expectation,
    NodeCondition,
    NodeTaint,
    PodAnnotation,
    PodsEvicted,
    PolicyCondition,
    PolicyStatus,
    PromQL,
    ValueTest,
    WorkloadObject,
    WorkloadRef,
    seconds,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    observed: str


@dataclass(frozen=True, slots=True)
class Names:
    """Scenario names to the names of the objects in the cluster."""

    workloads: Mapping[str, tuple[str, str]]  # workload -> (namespace in the cluster, name)
    nodes: Mapping[str, str]  # scenario node -> node (identical today; kept for prefixes)

    def workload(self, name: str) -> tuple[str, str]:
        return self.workloads[name]


def describe(e: Expectation) -> str:
    """A default name: the check in a few words."""
    c = e.check
    if isinstance(c, PodsEvicted):
        text = f"{'an original' if c.pods == 'original' else 'a'} pod of {c.workload} is evicted"
    elif isinstance(c, WorkloadRef):
        text = f"no pod of {c.workload} is evicted"
    elif isinstance(c, PodAnnotation):
        test = (
            f"== {c.equals!r}" if c.equals is not None
            else f"!= {c.not_equals!r}" if c.not_equals is not None
            else f"in {c.one_of}" if c.one_of is not None
            else f"contains {c.contains}" if c.contains is not None
            else "exists" if c.exists else "is absent"
        )  # fmt: skip
        text = f"{c.workload} pod annotation {c.key} {test}"
    elif isinstance(c, EventCheck):
        target = (
            f"{'the object' if c.owner else 'pods'} of {c.workload}" if c.workload
            else f"node {c.node}" if c.node else f"policy {c.policy}"
        )  # fmt: skip
        text = f"{'no ' if c.absent else ''}event {c.reason} on {target}"
    elif isinstance(c, NodeTaint):
        taint = c.key + (f"={c.value}" if c.value is not None else "") + (f":{c.effect}" if c.effect else "")
        text = f"node {c.node} {'not ' if e.node_not_tainted is not None else ''}tainted {taint}"
    elif isinstance(c, NodeCondition):
        text = f"node {c.node} condition {c.type}={c.status}"
    elif isinstance(c, PolicyCondition):
        text = f"policy {c.policy} condition {c.type}={c.status}"
    elif isinstance(c, PolicyStatus):
        text = f"policy {c.policy} status.{c.field} {_describe_test(c)}"
    elif isinstance(c, WorkloadObject):
        where = c.field if c.field is not None else f"annotation {c.annotation}"
        text = f"{c.workload} {where} {_describe_test(c)}"
    elif isinstance(c, CurrentPods):
        text = f"current pods of {c.workload} {_describe_test(c)}"
    else:
        assert isinstance(c, PromQL)
        text = f"PromQL {c.query} {_describe_test(c)}"
    timing = (
        f"for {format_duration(seconds(e.within))}"
        if e.held
        else f"within {format_duration(seconds(e.within))}"
    )
    if seconds(e.after) > 0:
        timing = f"{'from' if e.held else 'after'} {format_duration(seconds(e.after))} {timing}"
    return f"{text} {timing}"


def _describe_test(t: ValueTest) -> str:
    parts = []
    if t.equals is not None:
        parts.append(f"== {t.equals!r}")
    if t.at_least is not None:
        parts.append(f">= {t.at_least:g}")
    if t.at_most is not None:
        parts.append(f"<= {t.at_most:g}")
    if t.exists is not None:
        parts.append("exists" if t.exists else "is absent")
    return " and ".join(parts)


def _passes(test: ValueTest, value: Any) -> bool:
    if test.exists is not None and (value is not None) != test.exists:
        return False
    if value is None:
        return test.exists is False
    if test.equals is not None:
        if isinstance(test.equals, bool) or isinstance(value, bool):
            if str(value).lower() != str(test.equals).lower():
                return False
        elif isinstance(test.equals, int | float) and _number(value) is not None:
            if _number(value) != float(test.equals):
                return False
        elif str(value) != str(test.equals):
            return False
    number = _number(value)
    if test.at_least is not None and (number is None or number < test.at_least):
        return False
    return not (test.at_most is not None and (number is None or number > test.at_most))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _pod_name(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def check(
    e: Expectation,
    obs: Observation,
    names: Names,
    histories: Mapping[tuple[str, str], WorkloadHistory],
) -> Verdict:
    """Whether the expectation's condition holds in this observation, and what was seen."""
    c = e.check
    since = seconds(e.after)
    if isinstance(c, PodsEvicted | WorkloadRef):
        history = histories[names.workload(c.workload)]
        original_only = isinstance(c, PodsEvicted) and c.pods == "original"
        evicted = history.evictions(
            original_only=original_only, since=since if isinstance(c, WorkloadRef) else -1e18
        )
        seen = f"{len(history.pods)} pod(s) seen"
        if evicted:
            first = min(evicted, key=lambda p: p.evicted_at or 0.0)
            observed = (
                f"pod {first.namespace}/{first.name} evicted at {first.evicted_at:.1f}s ({first.how}); {seen}"
            )
        else:
            observed = f"no {'original ' if original_only else ''}pod evicted; {seen}"
        return Verdict(bool(evicted) == isinstance(c, PodsEvicted), observed)
    if isinstance(c, PodAnnotation):
        return _annotation(c, obs, names)
    if isinstance(c, EventCheck):
        return _event(c, obs, names, histories)
    if isinstance(c, NodeTaint):
        return _taint(c, e, obs, names)
    if isinstance(c, NodeCondition | PolicyCondition):
        return _condition(c, obs, names)
    if isinstance(c, PolicyStatus):
        policy = obs.policies.get(c.policy)
        if policy is None:
            return Verdict(False, f"policy {c.policy} not found")
        value: Any = policy.get("status") or {}
        for part in c.field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, list):  # a list counts its entries (recentEvictions: the hour's actions)
            return Verdict(_passes(c, len(value)), f"len(status.{c.field}) = {len(value)}")
        return Verdict(_passes(c, value), f"status.{c.field} = {value!r}")
    if isinstance(c, WorkloadObject):
        return _workload_object(c, obs, names)
    if isinstance(c, CurrentPods):
        namespace, workload = names.workload(c.workload)
        pods = current_pods(obs.pods, namespace, workload)
        if c.phase is not None:
            pods = [p for p in pods if (p.get("status") or {}).get("phase") == c.phase]
        count = len(pods)
        which = f" {c.phase}" if c.phase else ""
        return Verdict(_passes(c, count), f"{count} current{which} pod(s) of {c.workload}")
    assert isinstance(c, PromQL)
    return _promql(c, obs)


def _workload_object(c: WorkloadObject, obs: Observation, names: Names) -> Verdict:
    obj = obs.workloads.get(names.workload(c.workload))
    if obj is None:
        return Verdict(_passes(c, None), f"{c.workload}: object not found")
    value: Any
    if c.annotation is not None:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(c.annotation)
        where = f"annotation {c.annotation}"
    else:
        value = obj
        for part in (c.field or "").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        where = c.field or ""
    return Verdict(_passes(c, value), f"{c.workload} {where} = {value!r}")


def _annotation(c: PodAnnotation, obs: Observation, names: Names) -> Verdict:
    namespace, workload = names.workload(c.workload)
    pods = current_pods(obs.pods, namespace, workload)
    if not pods:
        return Verdict(False, "no current pod")
    results = []
    for pod in pods:
        value = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.key)
        if c.exists is not None:
            ok = (value is not None) == c.exists
        elif value is None:
            ok = False
        elif c.equals is not None:
            ok = value == c.equals
        elif c.not_equals is not None:
            ok = value != c.not_equals
        elif c.contains is not None:
            ok = all(part in value for part in c.contains)
        else:
            ok = value in (c.one_of or [])
        results.append(
            (
                ok,
                f"{_pod_name(pod)}: {c.key}={value!r}"
                if value is not None
                else f"{_pod_name(pod)}: no {c.key}",
            )
        )
    ok = all(r for r, _ in results) if c.pods == "all" else any(r for r, _ in results)
    return Verdict(ok, "; ".join(text for _, text in results))


def _event(
    c: EventCheck, obs: Observation, names: Names, histories: Mapping[tuple[str, str], WorkloadHistory]
) -> Verdict:
    if c.workload is not None and c.owner:
        namespace, workload = names.workload(c.workload)
        target = f"the object of {c.workload}"

        def about(obj: JSON) -> bool:
            return (
                obj.get("kind") != "Pod" and obj.get("namespace") == namespace and obj.get("name") == workload
            )
    elif c.workload is not None:
        namespace, workload = names.workload(c.workload)
        pods = {p.name for p in histories[(namespace, workload)].pods.values()}
        target = f"pods of {c.workload}"

        def about(obj: JSON) -> bool:
            return obj.get("kind") == "Pod" and obj.get("namespace") == namespace and obj.get("name") in pods
    elif c.node is not None:
        node = names.nodes[c.node]
        target = f"node {node}"

        def about(obj: JSON) -> bool:
            return obj.get("kind") == "Node" and obj.get("name") == node
    else:
        target = f"policy {c.policy}"

        def about(obj: JSON) -> bool:
            return obj.get("kind") == "GPUEfficiencyPolicy" and obj.get("name") == c.policy

    related = [ev for ev in obs.events if about(ev.get("involvedObject") or ev.get("regarding") or {})]
    matching = [
        ev
        for ev in related
        if ev.get("reason") == c.reason
        and (c.type is None or ev.get("type") == c.type)
        and (c.message_contains is None or c.message_contains in (ev.get("message") or ev.get("note") or ""))
    ]
    if matching:
        ev = matching[-1]
        observed = f"{ev.get('type')} {ev.get('reason')} on {target}: {(ev.get('message') or '')[:160]}"
    else:
        reasons = sorted({str(ev.get("reason")) for ev in related})
        observed = f"no {c.reason} event on {target}; reasons seen: {', '.join(reasons) or 'none'}"
    return Verdict(bool(matching) != c.absent, observed)


def _taint(c: NodeTaint, e: Expectation, obs: Observation, names: Names) -> Verdict:
    name = names.nodes[c.node]
    node = obs.nodes.get(name)
    if node is None:
        return Verdict(False, f"node {name} not found")
    taints = (node.get("spec") or {}).get("taints") or []
    match = [
        t
        for t in taints
        if t.get("key") == c.key
        and (c.value is None or t.get("value", "") == c.value)
        and (c.effect is None or t.get("effect") == c.effect)
    ]
    shown = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in taints) or "none"
    return Verdict(bool(match) == (e.node_tainted is not None), f"taints: {shown}")


def _condition(c: NodeCondition | PolicyCondition, obs: Observation, names: Names) -> Verdict:
    if isinstance(c, NodeCondition):
        obj, what = obs.nodes.get(names.nodes[c.node]), f"node {names.nodes[c.node]}"
    else:
        obj, what = obs.policies.get(c.policy), f"policy {c.policy}"
    if obj is None:
        return Verdict(False, f"{what} not found")
    conditions = (obj.get("status") or {}).get("conditions") or []
    found = next((x for x in conditions if x.get("type") == c.type), None)
    if found is None:
        return Verdict(False, f"{what} has no {c.type} condition")
    ok = found.get("status") == c.status and (c.reason is None or found.get("reason") == c.reason)
    observed = (
        f"{c.type}={found.get('status')} reason={found.get('reason', '')!r} {found.get('message', '')!r}"
    )
    return Verdict(ok, observed[:240])


def _promql(c: PromQL, obs: Observation) -> Verdict:
    result = obs.queries.get(c.query)
    if result is None:
        return Verdict(False, "query not run yet")
    if isinstance(result, str):
        return Verdict(False, f"query failed: {result}")
    if c.exists is False and not (c.equals is not None or c.at_least is not None or c.at_most is not None):
        return Verdict(not result, f"{len(result)} series")
    ok = any(_passes(c, value) for _, value in result)
    shown = "; ".join(f"{_labels(labels)} = {value:g}" for labels, value in result[:3])
    more = f" (+{len(result) - 3} more)" if len(result) > 3 else ""
    return Verdict(ok, f"{len(result)} series: {shown}{more}" if result else "no series")


def _labels(labels: Mapping[str, str]) -> str:
    keep = {
        k: v
        for k, v in labels.items()
        if k in ("__name__", "Hostname", "gpu", "pod", "namespace", "exported_pod")
    }
    return "{" + ",".join(f'{k}="{v}"' for k, v in keep.items()) + "}"


@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    name: str
    passed: bool
    observed: str
    t: float


class Tracker:
    """Deadlines and holds over a sequence of observations."""

    def __init__(self, expectations: list[Expectation]) -> None:
        self._expectations = expectations
        self._pending = set(range(len(expectations)))
        self._last: dict[int, str] = {}
        self.outcomes: list[Outcome] = []

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    @property
    def deadline(self) -> float:
        return max((seconds(e.within) for e in self._expectations), default=0.0)

    def name(self, index: int) -> str:
        e = self._expectations[index]
        return e.name or describe(e)

    def step(
        self, obs: Observation, names: Names, histories: Mapping[tuple[str, str], WorkloadHistory]
    ) -> list[Outcome]:
        """Judge the pending expectations on this observation; return the ones decided now."""
        decided = []
        for i in sorted(self._pending):
            e = self._expectations[i]
            if obs.t < seconds(e.after):
                continue
            verdict = check(e, obs, names, histories)
            self._last[i] = verdict.observed
            within = seconds(e.within)
            if e.held:
                if not verdict.ok:
                    decided.append(Outcome(i, self.name(i), False, verdict.observed, obs.t))
                elif obs.t >= within:
                    decided.append(Outcome(i, self.name(i), True, verdict.observed, obs.t))
            elif verdict.ok and obs.t <= within:
                decided.append(Outcome(i, self.name(i), True, verdict.observed, obs.t))
            elif obs.t >= within:
                decided.append(Outcome(i, self.name(i), False, verdict.observed, obs.t))
        for outcome in decided:
            self._pending.discard(outcome.index)
            self.outcomes.append(outcome)
        return decided

    def abandon(self, t: float, why: str) -> list[Outcome]:
        """Fail whatever is still pending (the run stopped early)."""
        decided = [
            Outcome(i, self.name(i), False, f"{why}; last observed: {self._last.get(i, 'nothing')}", t)
            for i in sorted(self._pending)
        ]
        self._pending.clear()
        self.outcomes.extend(decided)
        return decided

    def needs(self) -> set[str]:
        """Which kinds of data the pending expectations read (to poll only those)."""
        return {self._expectations[i].kind for i in self._pending}

    def queries(self) -> set[str]:
        return {q.query for i in self._pending if (q := self._expectations[i].metric) is not None}
