"""GPU fault quarantine: judge every GPU, decide every node, let the circuit breaker bound the taints.

Pure: a ``Snapshot`` in, a ``FaultOutcome`` out. A fault is judged per GPU (``ecc``,
``xid``, ``thermal``, ``pcie``) and held per node in the node's own annotation
(``node``, ``record``), so restarts and replicas agree. Only in-scope GPU nodes
(``selection.nodeSelector``, ``nvidia.com/gpu`` capacity > 0) are read or written.

Modes: Observe writes the GPUHealthy condition, the record and events, never a taint; Enforce also
taints, within the circuit breaker (``breaker``). When the metrics source is down nothing is
detected, recovered or newly tainted; manual recoveries still apply. Events are emitted on changes
only (a new fault, a taint set or removed, the breaker opening or closing); a steady state yields
no action at all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from gpu_efficiency.api.names import (
    COND_BREAKER,
    EV_BREAKER,
    EV_TAINTED,
    FAULT_RECOVERED,
    FAULT_TAINT_KEY,
    GPU_DEGRADED,
    GPU_HEALTHY,
    NODE_FAULTS,
)
from gpu_efficiency.api.policy import EccFault, FaultRules, Mode, Recovery, ThermalFault, XidFault
from gpu_efficiency.engine.conditions import find_condition
from gpu_efficiency.engine.model import (
    Action,
    DeviceUse,
    FaultOutcome,
    GPUSample,
    NodeEvent,
    NodeView,
    PodView,
    PolicyEvent,
    QuarantinedNodeRecord,
    Snapshot,
    TaintDevices,
    TaintNode,
    UntaintDevices,
    UntaintNode,
    Window,
)
from gpu_efficiency.engine.params import CycleParams, cycle_params
from gpu_efficiency.engine.quarantine.breaker import (
    BreakerDecision,
    GpuCost,
    breaker_message,
    decide_taints,
    gpu_budget,
    taint_budget,
)
from gpu_efficiency.engine.quarantine.data import DataRules, data_rules
from gpu_efficiency.engine.quarantine.dra import (
    NO_SCOPE,
    DeviceScope,
    describe_devices,
    device_scopes,
    with_dra_capacity,
)
from gpu_efficiency.engine.quarantine.drain import NO_DRAIN, DrainContext
from gpu_efficiency.engine.quarantine.ecc import judge_ecc
from gpu_efficiency.engine.quarantine.kinds import (
    DEGRADED_REASON_PREFIX,
    FAULT_REASON_PREFIX,
    KINDS,
    FaultKind,
    GpuJudgement,
    GpuState,
    kind_of,
    merge_judgements,
    with_witness,
)
from gpu_efficiency.engine.quarantine.node import FaultContext, KindRules, NodeDecision, decide_node, describe
from gpu_efficiency.engine.quarantine.pcie import judge_pcie
from gpu_efficiency.engine.quarantine.record import kind_order
from gpu_efficiency.engine.quarantine.thermal import judge_thermal
from gpu_efficiency.engine.quarantine.workloads import workload_actions
from gpu_efficiency.engine.quarantine.xid import judge_xid, new_xids
from gpu_efficiency.engine.quarantine.xid_catalogue import XidChoice
from gpu_efficiency.engine.quarantine.xid_repeats import XidSighting, screen_xids
from gpu_efficiency.engine.selection import compile_selector

Judgements = Mapping[str, Mapping[FaultKind, Sequence[GpuJudgement]]]  # node -> kind -> GPUs
#: A straggler (or a narrow PCIe link) only makes the scheduler prefer other nodes: the GPU works,
#: and its job may stay.
STRAGGLER_EFFECT = "PreferNoSchedule"


def fault_context(snapshot: Snapshot, rules: DataRules) -> FaultContext:
    """The policy's fault settings, parsed once per cycle."""
    faults: FaultRules = snapshot.policy.faults
    per_kind: dict[FaultKind, EccFault | XidFault | ThermalFault] = {
        FaultKind.ECC: faults.ecc,
        FaultKind.XID: faults.xid,
        FaultKind.THERMAL: faults.thermal,
    }
    kinds = {
        kind: KindRules(
            enabled=faults.enabled and spec.enabled,
            effect=spec.effect.value,
            automatic=spec.recovery == Recovery.AUTOMATIC,
            recovery_after_s=spec.recovery_after.seconds,
        )
        for kind, spec in per_kind.items()
    }
    stragglers = snapshot.policy.stragglers
    kinds[FaultKind.STRAGGLER] = KindRules(
        enabled=stragglers.enabled and stragglers.quarantine_hardware,
        effect=STRAGGLER_EFFECT,
        automatic=True,
        recovery_after_s=stragglers.for_duration.seconds,
    )
    # Recovery needs a whole lookback of full-width readings (``pcie``): no extra wait on top.
    kinds[FaultKind.PCIE] = KindRules(
        enabled=faults.enabled and faults.pcie.enabled,
        effect=STRAGGLER_EFFECT,
        automatic=True,
        recovery_after_s=0.0,
        taints=faults.pcie.taint,
    )
    return FaultContext(
        now=snapshot.now,
        enforce=snapshot.policy.mode == Mode.ENFORCE,
        data_ok=snapshot.metrics_available,
        kinds=kinds,
        xid_memory_s=rules.window_s[Window.FAULT] + rules.scrape_interval_s,
    )


def drain_contexts(snapshot: Snapshot, nodes: Iterable[NodeView], timeout: float) -> dict[str, DrainContext]:
    """Each in-scope node's drain inputs: its GPU pods and the claims holding its devices."""
    names = {n.name for n in nodes}
    pods: dict[str, list[PodView]] = defaultdict(list)
    for pod in snapshot.pods:
        if pod.node in names:
            pods[pod.node].append(pod)
    uses: dict[tuple[str, str, str], list[DeviceUse]] | None = None
    if snapshot.device_uses is not None:
        uses = defaultdict(list)
        for use in snapshot.device_uses:
            uses[use.key].append(use)
    return {
        name: DrainContext(
            timeout_s=timeout,
            pods=tuple(pods.get(name, ())),
            uses=uses,
            protected=snapshot.protected_namespaces,
            priority_threshold=snapshot.policy.eviction.priority_threshold,
        )
        for name in names
    }


def in_scope_nodes(snapshot: Snapshot) -> list[NodeView]:
    """GPU nodes the policy's node selector matches and no senior policy quarantines, by name."""
    matches = compile_selector(snapshot.policy.selection.node_selector)
    seniors = [
        compile_selector(s.selection.node_selector) for s in snapshot.senior_policies if s.faults_enabled
    ]
    return sorted(
        (
            n
            for n in with_dra_capacity(snapshot.nodes, snapshot.dra_devices)
            if n.gpu_capacity > 0 and matches(n.labels) and not any(senior(n.labels) for senior in seniors)
        ),
        key=lambda n: n.name,
    )


#: Windows that carry fault evidence; a GPU with none of them can show no fault.
FAULT_WINDOWS = (Window.FAULT, Window.THERMAL_HOLD, Window.THERMAL_RECOVERY)
_FAULT_WINDOW_SET = frozenset(FAULT_WINDOWS)


def _quiet(node: NodeView) -> bool:
    """Nothing of ours on the node: no fault record, recovery request, fault taint or fault condition.

    On such a node only a GPU judged FAULT changes anything (``decide_node``: no entry to age,
    recover or release, no condition to clear, no record to write), and a GPU without fault windows
    is never judged FAULT (all its judgements are UNKNOWN). So its GPUs without fault windows need
    no judging, and when none has any, its decision is empty. Sources that fetch fault windows only
    for GPUs that may be faulted (the Prometheus source's hints) leave most GPUs without them.
    """
    annotations = node.annotations
    if NODE_FAULTS in annotations or FAULT_RECOVERED in annotations:
        return False
    if any(t.key == FAULT_TAINT_KEY for t in node.taints):
        return False
    return not any(
        (c.type == GPU_HEALTHY and c.status == "False" and c.reason.startswith(FAULT_REASON_PREFIX))
        or (c.type == GPU_DEGRADED and c.status == "True" and c.reason.startswith(DEGRADED_REASON_PREFIX))
        for c in node.conditions
    )


def _worth_judging(gpus: Iterable[GPUSample], quiet: set[str]) -> Iterator[GPUSample]:
    """The GPUs whose judgement can matter (see ``_quiet``)."""
    for gpu in gpus:
        if gpu.node not in quiet or not _FAULT_WINDOW_SET.isdisjoint(gpu.stats):
            yield gpu


def judge_gpus(
    gpus: Iterable[GPUSample], nodes: set[str], rules: DataRules, faults: FaultRules
) -> Judgements:
    """Every kind's judgement of every GPU on ``nodes``; a GPU seen by two sources is merged."""
    raw: dict[str, dict[FaultKind, dict[str, list[GpuJudgement]]]] = defaultdict(
        lambda: {kind: defaultdict(list) for kind in KINDS}
    )
    taints = XidChoice(faults.xid)

    def judged(gpu: GPUSample) -> dict[FaultKind, GpuJudgement]:
        out = {
            FaultKind.ECC: judge_ecc(gpu, rules),
            FaultKind.XID: judge_xid(gpu, rules, taints=taints),
            FaultKind.THERMAL: judge_thermal(gpu, rules, faults.thermal),
            FaultKind.PCIE: judge_pcie(gpu, rules),
        }
        if all(j.state is not GpuState.FAULT for j in out.values()):
            return out
        newest = _newest_fault_sample(gpu)  # only a fault needs it (``_NodeCycle._unconfirmed``)
        return {k: replace(j, newest=newest) if j.state is GpuState.FAULT else j for k, j in out.items()}

    for gpu in gpus:
        if gpu.node not in nodes:
            continue
        per_kind = raw[gpu.node]
        own = judged(gpu)
        second = judged(gpu.witness) if gpu.witness is not None and gpu.witness.node == gpu.node else {}
        for kind, judgement in own.items():
            per_kind[kind][gpu.uuid].append(with_witness(judgement, second.get(kind)))
    return {
        node: {kind: [merge_judgements(js) for js in by_uuid.values()] for kind, by_uuid in per_kind.items()}
        for node, per_kind in raw.items()
    }


def _newest_fault_sample(gpu: GPUSample) -> float:
    """The newest sample time in the GPU's fault windows (NaN: none)."""
    newest = math.nan
    for window in FAULT_WINDOWS:
        for stats in gpu.stats.get(window, {}).values():
            if stats.last_timestamp > newest or math.isnan(newest):
                newest = stats.last_timestamp
    return newest


def _taint_actions(decision: NodeDecision, granted: bool) -> list[Action]:
    """Untaints first, then the granted wishes: on the node, or on its devices (``devices``).

    A fault moving between the node and its devices gets its new quarantine before the old one
    goes, so it is never without one.
    """
    node = decision.node
    actions: list[Action] = []
    for kind in sorted(decision.untaint, key=kind_order):
        if kind in decision.on_node:
            actions.append(UntaintNode(node=node, kind=kind))
        if kind in decision.on_devices:
            actions.append(UntaintDevices(node=node, kind=kind))
    if not granted:
        return actions
    for kind in sorted(decision.wants, key=kind_order):
        effect = decision.wants[kind]
        entry = decision.held[kind]
        devices = decision.devices.get(kind)
        if devices is not None:
            actions.append(TaintDevices(node=node, kind=kind, effect=effect, devices=devices))
            if kind in decision.on_node:
                actions.append(UntaintNode(node=node, kind=kind))
            message = (
                f"tainted device(s) {describe_devices(devices)} with {FAULT_TAINT_KEY}={kind}:{effect} "
                f"(DeviceTaintRule) for the {kind} fault on {describe(entry.gpus)}; "
                "the node stays schedulable for its healthy GPUs"
            )
        else:
            actions.append(TaintNode(node=node, kind=kind, effect=effect))
            if kind in decision.on_devices:
                actions.append(UntaintDevices(node=node, kind=kind))
            message = (
                f"tainted {FAULT_TAINT_KEY}={kind}:{effect} for the {kind} fault on {describe(entry.gpus)}"
            )
        actions.append(NodeEvent(node=decision.node, reason=EV_TAINTED, message=message, type="Warning"))
        actions.append(
            PolicyEvent(reason=EV_TAINTED, message=f"node {decision.node}: {message}", type="Warning")
        )
    return actions


def gpu_cost(decision: NodeDecision, scope: DeviceScope, capacity: int) -> GpuCost:
    """GPUs the node's quarantine takes now, and with its wishes granted: all of its GPUs under a
    node taint, else one per device under our rules."""

    def taken(on_node: bool, keys: set[tuple[str, str, str]]) -> int:
        return capacity if on_node else min(capacity, len(keys)) if capacity else len(keys)

    now_keys = {key for rules in scope.rules.values() for key in rules}
    after_keys: set[tuple[str, str, str]] = set()
    after_node = False
    for kind in {*decision.present, *decision.wants}:
        if kind in decision.wants:
            devices = decision.devices.get(kind)
            if devices is None:
                after_node = True
            else:
                after_keys.update(d.key for d in devices)
        elif kind not in decision.untaint:
            if kind in decision.on_node:
                after_node = True
            after_keys.update(scope.rules.get(kind, {}))
    return GpuCost(now=taken(bool(decision.on_node), now_keys), after=taken(after_node, after_keys))


def _quarantined(decision: NodeDecision, granted: bool) -> list[QuarantinedNodeRecord]:
    out = []
    for kind in sorted(decision.held, key=kind_order):
        entry = decision.held[kind]
        tainted = (kind in decision.present and kind not in decision.untaint) or (
            granted and kind in decision.wants
        )
        out.append(
            QuarantinedNodeRecord(
                node=decision.node,
                kind=kind,
                gpus=tuple(g.label for g in entry.gpus),
                tainted=tainted,
                since=entry.since,
            )
        )
    return out


def _breaker_events(
    decision: BreakerDecision, by_node: Mapping[str, NodeDecision], was_open: bool, message: str
) -> tuple[list[Action], dict[str, list[Action]]]:
    """Policy events for a flip, node events for nodes denied when it opens or on a new fault."""
    policy: list[Action] = []
    nodes: dict[str, list[Action]] = defaultdict(list)
    if decision.open and not was_open:
        policy.append(
            PolicyEvent(reason=EV_BREAKER, message=f"circuit breaker open: {message}", type="Warning")
        )
    elif was_open and not decision.open:
        policy.append(
            PolicyEvent(
                reason=EV_BREAKER,
                message="circuit breaker closed: every faulty node may be tainted",
                type="Normal",
            )
        )
    for node in decision.denied:
        if not was_open or by_node[node].new_kinds:
            text = f"not tainted although faulty: circuit breaker open ({message})"
            nodes[node].append(NodeEvent(node=node, reason=EV_BREAKER, message=text, type="Warning"))
    return policy, nodes


def _with_stragglers(
    judged: Judgements, stragglers: Sequence[GpuJudgement], scope: set[str], quiet: set[str]
) -> Judgements:
    """``judged`` plus the straggler judgements of in-scope nodes; a quiet node only for a FAULT (a
    GPU at its peers' speed on a node holding nothing changes nothing, see ``_quiet``)."""
    by_node: dict[str, list[GpuJudgement]] = defaultdict(list)
    for j in stragglers:
        if j.node in scope:
            by_node[j.node].append(j)
    out = {node: dict(per_kind) for node, per_kind in judged.items()}
    for node, found in by_node.items():
        if node in quiet and not any(j.state is GpuState.FAULT for j in found):
            continue
        out.setdefault(node, {})[FaultKind.STRAGGLER] = found
    return out


def _degraded(kind: str) -> bool:
    known = kind_of(kind)
    return known is not None and known.degraded


def evaluate_faults(
    snapshot: Snapshot, stragglers: Sequence[GpuJudgement] = (), *, params: CycleParams | None = None
) -> FaultOutcome:
    """This cycle's fault quarantine: actions in apply order, quarantined nodes, breaker state.

    ``stragglers``: this cycle's straggler judgements of GPUs in judged job groups
    (``stragglers.straggler_judgements``), held as the ``straggler`` kind when the policy
    quarantines hardware stragglers. ``params``: the cycle's (by default from the snapshot's policy).
    """
    spec = snapshot.policy
    params = params if params is not None else cycle_params(spec)
    rules = data_rules(params, snapshot.now)
    ctx = fault_context(snapshot, rules)
    nodes = in_scope_nodes(snapshot)
    scopes = device_scopes(nodes, snapshot.dra_devices, snapshot.device_rules, spec.faults.device_quarantine)

    def scope_of(node: str) -> DeviceScope:
        return scopes.get(node, NO_SCOPE)

    quiet = {n.name for n in nodes if _quiet(n) and not scope_of(n.name).rules}  # our rules: not quiet
    judged: Judgements = (
        judge_gpus(_worth_judging(snapshot.gpus, quiet), {n.name for n in nodes}, rules, spec.faults)
        if ctx.data_ok
        else {}
    )
    if ctx.data_ok and stragglers:
        judged = _with_stragglers(judged, stragglers, {n.name for n in nodes}, quiet)
    xid_actions: list[Action] = []
    if ctx.data_ok and ctx.kinds[FaultKind.XID].enabled:
        scope = {n.name for n in nodes}
        sightings: list[XidSighting] = []
        counts: dict[str, Mapping[int, Mapping[int, int]]] = {}
        for g in snapshot.gpus:
            # new_xids reads only these two: most GPUs have neither (fault windows are fetched for candidates)
            if (g.xid_events is None and Window.FAULT not in g.stats) or g.node not in scope:
                continue
            if g.xid_events is not None:
                counts[g.uuid] = g.xid_events
            sightings.extend(XidSighting(g.node, g.uuid, g.index, code) for code in new_xids(g, rules))
        screen = screen_xids(
            judged,
            sightings,
            {n.name: n.annotations for n in nodes},
            spec.faults.xid,
            now=snapshot.now,
            memory_s=ctx.xid_memory_s,
            counts=counts,
        )
        judged, xid_actions = screen.judged, screen.actions
    else:
        screen = None
    decided = [n for n in nodes if n.name not in quiet or n.name in judged]  # the rest: empty decisions
    drains = drain_contexts(snapshot, decided, params.drain_timeout_s)
    made = {
        node.name: decide_node(
            node,
            judged.get(node.name, {}),
            ctx,
            scope=scope_of(node.name),
            drain=drains.get(node.name, NO_DRAIN),
        )
        for node in decided
    }
    decisions = [
        made[node.name] if node.name in made else NodeDecision(node=node.name, present={}, held={})
        for node in nodes
    ]
    by_node = {d.node: d for d in decisions}

    breaker_spec = spec.faults.circuit_breaker
    tainted_now = {d.node for d in decisions if d.present}
    capacity = {n.name: n.gpu_capacity for n in nodes}
    gpus_in_scope = sum(capacity.values())
    costs = {
        d.node: gpu_cost(d, scope_of(d.node), capacity[d.node]) for d in decisions if d.present or d.wants
    }
    breaker = decide_taints(
        {d.node: list(d.wants) for d in decisions if d.wants},
        tainted_now,
        taint_budget(len(nodes), breaker_spec),
        gpus=costs,
        gpu_cap=gpu_budget(list(capacity.values()), breaker_spec),
    )
    # Nodes granted a taint are decided again knowing it, so their record says our taint is set in
    # the write that goes with the taint: an admin who removes it before the next cycle is then
    # respected, not mistaken for a taint never set (the applier keeps the old record if the taint
    # write fails, so a failed taint is retried rather than taken for the admin's).
    views = {n.name: n for n in nodes}
    decisions = [
        decide_node(
            views[d.node],
            judged.get(d.node, {}),
            ctx,
            granted=True,
            scope=scope_of(d.node),
            drain=drains.get(d.node, NO_DRAIN),
        )
        if d.wants and d.node in breaker.granted
        else d
        for d in decisions
    ]
    by_node = {d.node: d for d in decisions}
    previous = find_condition(snapshot.status.conditions, COND_BREAKER)
    was_open = previous is not None and previous.status == "True"
    message = breaker_message(breaker, len(nodes), breaker_spec, gpus_in_scope) if breaker.open else ""
    policy_events: list[Action] = []
    node_events: Mapping[str, list[Action]] = {}
    if ctx.data_ok:
        breaker_open = breaker.open
        policy_events, node_events = _breaker_events(breaker, by_node, was_open, message)
    else:  # no data, no decision: the breaker keeps its state instead of flapping
        breaker_open = was_open
        message = previous.message if previous is not None and was_open else ""

    actions: list[Action] = []
    quarantined: list[QuarantinedNodeRecord] = []
    notes: list[str] = []
    if screen is not None:
        notes.extend(screen.notes)
    if not ctx.data_ok:
        notes.append(
            f"metrics unavailable ({snapshot.metrics_error or 'no detail'}): "
            "no fault detected, recovered or tainted"
        )
    for decision in decisions:
        granted = decision.node in breaker.granted
        actions.extend(_taint_actions(decision, granted))
        actions.extend(decision.drains)  # after the taints: nothing new lands while the pods leave
        actions.extend(decision.writes)
        actions.extend(decision.events)
        actions.extend(node_events.get(decision.node, ()))
        quarantined.extend(_quarantined(decision, granted))
        notes.extend(decision.notes)
        if decision.wants and not granted:
            notes.append(f"node {decision.node}: faulty but not tainted, the circuit breaker is open")
    actions.extend(policy_events)
    actions.extend(xid_actions)
    # gpu-fault names broken GPUs only: a straggler's pods carry the straggler annotation already,
    # and a narrow PCIe link slows host transfers, not the results.
    held = {d.node: {k: e for k, e in d.held.items() if not _degraded(k)} for d in decisions}
    actions.extend(workload_actions(held, snapshot.gpus, snapshot.pods, data_ok=ctx.data_ok))
    return FaultOutcome(
        actions=tuple(actions),
        quarantined=tuple(quarantined),
        breaker_open=breaker_open,
        breaker_message=message,
        notes=tuple(notes),
    )
