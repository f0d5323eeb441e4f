"""XID sightings per GPU and code: repeat rules, flood counts and cross-node incidents.

The XID gauge shows the last code only, so one *sighting* is a code the series newly shows
(``faults_xid.new_xid``) that is either another code than the GPU's last sighting or comes after
the change has left the lookback window (the same rule ``faults_novelty`` uses for a held XID).
Sightings are kept per node in the annotation ``gpuefficiency.io/xid-history`` (state in the
cluster, safety rule 6), pruned past the longest window that needs them, at most ``MAX_PER_CODE``
per GPU and code::

    {"gpus": {"GPU-1": {"94": [1714557600, 1714558200]}}, "incident": 1714557600}

With them, per cycle and before the node decisions:

- a code covered by ``spec.faults.xid.repeat`` is a fault only once it was seen ``count`` times on
  one GPU within ``within`` (until then PENDING, which never taints nor recovers);
- a fault's summary carries its count (``xid=79 x12 in 1h``), so a flood shows in one event and in
  the condition, not as one event per change;
- where the exporter counts XIDs (``DCGM_EXP_XID_ERRORS_COUNT``: ``counts``), a repeat rule's and
  a flood's count is the events counted within its window instead of the sightings, which see a
  repeated code only once per lookback;
- application-class XIDs (catalogue class restart-app or ignore) newly seen on at least
  ``incidentNodes`` nodes in the same cycle are one incident: one policy event naming the nodes,
  and none of them taints, even where a policy lists the code as critical (``incident`` keeps that
  verdict for as long as the change is visible).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_efficiency.api.names import EV_XID_INCIDENT, XID_HISTORY
from gpu_efficiency.api.policy import XidFault
from gpu_efficiency.engine.model import Action, AnnotateNode, PolicyEvent
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState
from gpu_efficiency.engine.quarantine.xid_catalogue import explain, is_application

#: Sightings kept per GPU and code (a flood's count saturates here; the rules' counts are lower).
MAX_PER_CODE = 64
#: How long sightings are kept for flood counts when no repeat rule needs longer.
FLOOD_WINDOW_S = 3600.0
#: Nodes named in an incident event; the rest are counted.
MAX_NAMED_NODES = 20

History = Mapping[str, Mapping[int, tuple[float, ...]]]  # uuid -> code -> sighting times, oldest first


@dataclass(frozen=True, slots=True)
class XidSighting:
    """A GPU whose XID series newly shows ``code`` this cycle."""

    node: str
    uuid: str
    index: str
    code: int


@dataclass(frozen=True, slots=True)
class NodeHistory:
    gpus: History = field(default_factory=dict)
    incident: float | None = None  # when this node's application XIDs were last part of an incident


@dataclass(slots=True)
class XidScreen:
    """The screen's outcome: judgements to decide with, and the writes, events and notes it needs."""

    judged: dict[str, dict[FaultKind, list[GpuJudgement]]]
    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def parse_history(text: str | None) -> tuple[NodeHistory, str]:
    """The annotation's history, or an empty one and why (never raises: it may be edited by hand)."""
    if not text:
        return NodeHistory(), ""
    try:
        raw = json.loads(text)
        gpus: dict[str, dict[int, tuple[float, ...]]] = {}
        for uuid, codes in raw.get("gpus", {}).items():
            gpus[str(uuid)] = {
                int(code): tuple(sorted(float(t) for t in times if math.isfinite(float(t))))
                for code, times in codes.items()
            }
        incident = raw.get("incident")
        return NodeHistory(gpus, None if incident is None else float(incident)), ""
    except (ValueError, TypeError, AttributeError) as exc:
        return NodeHistory(), f"{XID_HISTORY} is malformed ({exc}): starting a new history"


def dump_history(history: NodeHistory) -> str | None:
    """Canonical JSON (an unchanged history makes no write); None when there is nothing to keep."""
    gpus = {
        uuid: {str(code): [int(t) for t in times] for code, times in sorted(codes.items()) if times}
        for uuid, codes in sorted(history.gpus.items())
    }
    gpus = {uuid: codes for uuid, codes in gpus.items() if codes}
    if not gpus:
        return None
    out: dict[str, object] = {"gpus": gpus}
    if history.incident is not None:
        out["incident"] = int(history.incident)
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def _last_code(codes: Mapping[int, tuple[float, ...]]) -> int | None:
    dated = [(times[-1], code) for code, times in codes.items() if times]
    return max(dated)[1] if dated else None


def record(
    history: NodeHistory,
    sightings: Sequence[XidSighting],
    *,
    now: float,
    memory_s: float,
    keep_s: float,
) -> tuple[NodeHistory, list[XidSighting]]:
    """The history with this cycle's sightings added and old ones pruned, and the sightings that are new."""
    gpus = {uuid: dict(codes) for uuid, codes in history.gpus.items()}
    fresh = []
    for s in sightings:
        codes = gpus.setdefault(s.uuid, {})
        times = codes.get(s.code, ())
        if not times or now - times[-1] >= memory_s or _last_code(codes) != s.code:
            codes[s.code] = (*times, now)[-MAX_PER_CODE:]
            fresh.append(s)
    pruned = {
        uuid: {
            code: kept
            for code, times in codes.items()
            if (kept := tuple(t for t in times if now - t < keep_s))
        }
        for uuid, codes in gpus.items()
    }
    return NodeHistory({u: c for u, c in pruned.items() if c}, history.incident), fresh


def count(history: NodeHistory, uuid: str, code: int, *, now: float, within_s: float) -> int:
    """Sightings of ``code`` on the GPU within the last ``within_s`` seconds."""
    return sum(1 for t in history.gpus.get(uuid, {}).get(code, ()) if now - t < within_s)


@dataclass(frozen=True, slots=True)
class RepeatRule:
    count: int
    within_s: float
    within: str


def repeat_rules(spec: XidFault) -> dict[int, RepeatRule]:
    """Each covered code's rule (the policy model rejects a code in two rules)."""
    return {
        code: RepeatRule(rule.count, rule.within.seconds, rule.within)
        for rule in spec.repeat
        for code in rule.codes
    }


def keep_seconds(spec: XidFault, memory_s: float) -> float:
    """How long sightings must be kept: the longest repeat window, the flood window, the lookback."""
    return max([FLOOD_WINDOW_S, memory_s, *(r.within_s for r in repeat_rules(spec).values())])


def _incident_event(code_nodes: Mapping[int, set[str]]) -> PolicyEvent:
    nodes = sorted(set().union(*code_nodes.values()))
    named = ", ".join(nodes[:MAX_NAMED_NODES]) + (
        f" and {len(nodes) - MAX_NAMED_NODES} more" if len(nodes) > MAX_NAMED_NODES else ""
    )
    codes = "; ".join(explain(code) for code in sorted(code_nodes))
    message = (
        f"application XID incident on {len(nodes)} nodes at once ({named}): one workload failing, not the "
        f"hardware; no node is tainted for it. {codes}"
    )
    return PolicyEvent(reason=EV_XID_INCIDENT, message=message, type="Warning")


def screen_xids(
    judged: Mapping[str, Mapping[FaultKind, Sequence[GpuJudgement]]],
    sightings: Sequence[XidSighting],
    annotations: Mapping[str, Mapping[str, str]],
    spec: XidFault,
    *,
    now: float,
    memory_s: float,
    counts: Mapping[str, Mapping[int, Mapping[int, int]]] | None = None,
) -> XidScreen:
    """Apply repeat rules, flood counts and incidents to this cycle's XID judgements (see module doc).

    ``annotations``: every in-scope node's annotations (their histories are read and pruned);
    ``sightings``: this cycle's new XID codes per GPU (clean data only); ``counts``: per GPU that
    the exporter counts XIDs for, duration (s) -> code -> events (``GPUSample.xid_events``).
    """
    keep_s = keep_seconds(spec, memory_s)
    rules = repeat_rules(spec)
    by_node: dict[str, list[XidSighting]] = {}
    for s in sightings:
        by_node.setdefault(s.node, []).append(s)
    out = XidScreen(judged={node: {k: list(js) for k, js in kinds.items()} for node, kinds in judged.items()})
    histories: dict[str, NodeHistory] = {}
    fresh: list[XidSighting] = []
    for node, node_annotations in annotations.items():
        raw = node_annotations.get(XID_HISTORY)
        old, problem = parse_history(raw)
        if problem:
            out.notes.append(f"node {node}: {problem}")
        new, new_sightings = record(old, by_node.get(node, ()), now=now, memory_s=memory_s, keep_s=keep_s)
        histories[node] = new
        fresh.extend(new_sightings)

    app: dict[int, set[str]] = {}
    for s in fresh:
        if is_application(s.code):
            app.setdefault(s.code, set()).add(s.node)
    incident_nodes = set().union(*app.values()) if app else set()
    if len(incident_nodes) >= spec.incident_nodes:
        out.actions.append(_incident_event(app))
        out.notes.append(f"application XID incident on {len(incident_nodes)} nodes: nothing tainted for it")
        for node in incident_nodes:
            histories[node] = replace(histories[node], incident=now)

    for node, history in histories.items():
        xids = out.judged.get(node, {}).get(FaultKind.XID)
        if xids:
            out.judged[node][FaultKind.XID] = [
                _screen(j, history, rules, now, (counts or {}).get(j.uuid)) for j in xids
            ]
        text = dump_history(history)
        if text != annotations[node].get(XID_HISTORY):
            out.actions.append(AnnotateNode(node=node, annotations={XID_HISTORY: text}))
    return out


def _screen(
    judgement: GpuJudgement,
    history: NodeHistory,
    rules: Mapping[int, RepeatRule],
    now: float,
    counted: Mapping[int, Mapping[int, int]] | None = None,
) -> GpuJudgement:
    if judgement.state is not GpuState.FAULT:
        return judgement
    code = int(judgement.fingerprint["xid"])

    def within(seconds: float) -> int:
        exact = counted.get(max(1, round(seconds))) if counted is not None else None
        if exact is not None:
            return exact.get(code, 0)
        return count(history, judgement.uuid, code, now=now, within_s=seconds)

    seen = history.gpus.get(judgement.uuid, {}).get(code, ())
    if is_application(code) and history.incident is not None and seen and seen[-1] <= history.incident:
        return replace(
            judgement, state=GpuState.HEALTHY, reason=f"XID {code} was part of an incident", triggered=()
        )
    rule = rules.get(code)
    if rule is not None:
        n = within(rule.within_s)
        if n < rule.count:
            return replace(
                judgement,
                state=GpuState.PENDING,
                reason=f"XID {code} seen {n} of {rule.count} times within {rule.within}",
                triggered=(),
            )
        return replace(judgement, summary=f"xid={code} x{n} in {rule.within}")
    n = within(FLOOD_WINDOW_S)
    return replace(judgement, summary=f"xid={code} x{n} in 1h") if n > 1 else judgement
