"""One node's fault state machine: record, recoveries, detections, condition; taints are wishes.

Each cycle, in order: a manual recovery request (``gpuefficiency.io/fault-recovered``) releases the
kinds it names; taints of released faults are removed (and their removal confirmed next cycle);
our taint seen or missing updates ``tainted``/``manualUntaint``; baselines of hand-recovered
faults age; new faults (beyond their reference fingerprint) open or renew an entry; held faults
whose kind recovers automatically are released when their GPUs are healthy. What the node should be
tainted with is returned as a wish: the circuit breaker (``breaker``) decides across nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_efficiency.api.names import (
    EV_DRAIN,
    EV_FAULT,
    EV_UNTAINTED,
    FAULT_RECOVERED,
    FAULT_TAINT_KEY,
    GPU_DEGRADED,
    GPU_HEALTHY,
    NODE_FAULTS,
)
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import (
    Action,
    AnnotateNode,
    DraDevice,
    DrainPod,
    NodeEvent,
    NodeView,
    PolicyEvent,
    SetNodeCondition,
)
from gpu_efficiency.engine.quarantine.dra import NO_SCOPE, DeviceScope
from gpu_efficiency.engine.quarantine.drain import HARD, NO_DRAIN, SOFT, DrainContext, drain_step
from gpu_efficiency.engine.quarantine.kinds import (
    DEGRADED_REASON_PREFIX,
    FAULT_REASON_PREFIX,
    KINDS,
    REASON_CLEARED,
    REASON_DEGRADED_CLEARED,
    REASON_DEGRADED_MULTIPLE,
    REASON_MULTIPLE,
    FaultKind,
    GpuJudgement,
    GpuState,
    kind_of,
)
from gpu_efficiency.engine.quarantine.novelty import baseline_expired, is_new, lowered
from gpu_efficiency.engine.quarantine.record import (
    Baseline,
    FaultEntry,
    GpuFault,
    NodeFaultRecord,
    dump_record,
    kind_order,
    merge_gpus,
    parse_record,
    sorted_gpus,
    with_fingerprints,
)
from gpu_efficiency.engine.quarantine.taints import our_taints
from gpu_efficiency.engine.quarantine.xid_catalogue import xid_advice

#: Longest GPUHealthy message; longer ones end with how many faults were left out.
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class KindRules:
    """One fault kind's policy, parsed."""

    enabled: bool  # detect new faults and taint for them
    effect: str
    automatic: bool  # recover without an admin
    recovery_after_s: float
    taints: bool = True  # False: held and reported only, never tainted (a PCIe link by default)


@dataclass(frozen=True, slots=True)
class FaultContext:
    """What every node's decision shares this cycle."""

    now: float
    enforce: bool
    data_ok: bool  # False when the metrics source failed: no detection, no recovery, no new taint
    kinds: Mapping[FaultKind, KindRules]
    xid_memory_s: float  # lookback + one scrape: how long an XID change stays visible


@dataclass(slots=True)
class NodeDecision:
    """A node's outcome before the circuit breaker: ``wants`` still needs its approval."""

    node: str
    present: dict[
        str, str
    ]  # our taints (node taints and device rules) at the start of the cycle: kind -> effect
    held: dict[str, FaultEntry]  # faults held after this cycle
    on_node: dict[str, str] = field(default_factory=dict)  # kinds of ``present`` held by a node taint
    on_devices: set[str] = field(default_factory=set)  # kinds of ``present`` held by device rules
    devices: dict[str, tuple[DraDevice, ...]] = field(default_factory=dict)  # wants held on devices
    untaint: dict[str, str] = field(default_factory=dict)  # kind -> why
    wants: dict[str, str] = field(default_factory=dict)  # kind -> effect, pending the breaker
    new_kinds: list[str] = field(default_factory=list)  # kinds detected or renewed this cycle
    writes: list[Action] = field(default_factory=list)  # condition and record annotation
    drains: list[Action] = field(default_factory=list)  # evictions before a NoExecute taint (``drain``)
    events: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _gpu_fault(judgement: GpuJudgement) -> GpuFault:
    return GpuFault(
        index=judgement.index,
        uuid=judgement.uuid,
        value=judgement.summary,
        fingerprint={k: float(v) for k, v in judgement.fingerprint.items()},
    )


def describe(gpus: Sequence[GpuFault]) -> str:
    """'GPU 0:GPU-a (dbe=3 (+1)), GPU 1:GPU-b (xid=79)'."""
    return ", ".join(f"GPU {g.label} ({g.value})" if g.value else f"GPU {g.label}" for g in gpus)


def parse_recovery(text: str, known: set[str]) -> tuple[list[str], list[str]]:
    """Kinds a fault-recovered annotation names ('all' = every kind) and tokens it names in vain."""
    kinds: set[str] = set()
    unknown: list[str] = []
    for token in re.split(r"[\s,]+", text.strip().lower()):
        if not token:
            continue
        if token == "all":
            kinds |= known | {k.value for k in FaultKind}
        elif kind_of(token) is not None or token in known:
            kinds.add(token)
        else:
            unknown.append(token)
    return sorted(kinds, key=kind_order), unknown


def _releasing(entry: FaultEntry | None, now: str) -> FaultEntry:
    if entry is None:
        return FaultEntry(since=now, detected=now, gpus=(), tainted=True, releasing=True)
    return replace(entry, releasing=True, manual_untaint=False)


def _merge_baseline(old: Baseline | None, entry: FaultEntry) -> Baseline:
    gpus = dict(old.gpus) if old is not None else {}
    gpus.update({g.uuid: dict(g.fingerprint) for g in entry.gpus})
    at = entry.detected
    if old is not None and (parse_rfc3339(old.at) or 0.0) > (parse_rfc3339(at) or 0.0):
        at = old.at
    return Baseline(at=at, gpus=gpus)


class _NodeCycle:
    """Mutable working state of one node for one cycle (kept private; the result is a NodeDecision)."""

    def __init__(
        self,
        node: NodeView,
        judgements: Mapping[FaultKind, Sequence[GpuJudgement]],
        ctx: FaultContext,
        *,
        granted: bool = False,
        scope: DeviceScope = NO_SCOPE,
        drain: DrainContext = NO_DRAIN,
    ):
        self.node = node
        self.ctx = ctx
        self.granted = granted
        self.scope = scope
        self.drain = drain
        self.now_text = format_rfc3339(ctx.now)
        self.judgements = judgements
        self.by_uuid = {kind: {j.uuid: j for j in js} for kind, js in judgements.items()}
        self.raw = node.annotations.get(NODE_FAULTS)
        record, problem = parse_record(self.raw)
        self.faults: dict[str, FaultEntry] = dict(record.faults)
        self.baselines: dict[str, Baseline] = dict(record.baselines)
        on_node = our_taints(node.taints)
        present = dict(on_node)
        for kind, rules in scope.rules.items():
            if rules:
                present.setdefault(kind, next(iter(rules.values())))
        self.out = NodeDecision(
            node=node.name,
            present=present,
            held={},
            on_node=on_node,
            on_devices={k for k, r in scope.rules.items() if r},
        )
        self.announce: set[str] = set()  # untaints decided this cycle (retries are not announced)
        if problem:
            self.out.notes.append(f"node {node.name}: {problem}")

    # -- helpers ---------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.out.notes.append(f"node {self.node.name}: {text}")

    def event(self, reason: str, message: str, type_: str, *, policy: bool = True) -> None:
        self.out.events.append(NodeEvent(node=self.node.name, reason=reason, message=message, type=type_))
        if policy:
            self.out.events.append(
                PolicyEvent(reason=reason, message=f"node {self.node.name}: {message}", type=type_)
            )

    def release(self, kind: str, entry: FaultEntry | None, why: str) -> None:
        """End a fault: remove our taint if it is there (confirmed next cycle), else the entry."""
        if kind in self.out.present:
            self.out.untaint[kind] = why
            self.announce.add(kind)
            self.faults[kind] = _releasing(entry, self.now_text)
        else:
            self.faults.pop(kind, None)

    # -- steps -------------------------------------------------------------------------------------

    def manual_recovery(self) -> str | None:
        request = self.node.annotations.get(FAULT_RECOVERED)
        if request is None:
            return None
        ours = {k for k in self.out.present if kind_of(k) is not None}  # never another's token
        kinds, unknown = parse_recovery(request, set(self.faults) | ours)
        if unknown:
            self.note(f"{FAULT_RECOVERED} names unknown fault kinds {unknown}: ignored")
        released = []
        for kind in kinds:
            entry = self.faults.get(kind)
            held = entry if entry is not None and entry.held else None
            if held is not None:
                self.baselines[kind] = _merge_baseline(self.baselines.get(kind), held)
                released.append(kind)
            if held is not None or kind in self.out.present:
                self.release(kind, entry, f"{FAULT_RECOVERED}={request} set by an admin")
        if released:
            self.note(f"{', '.join(released)} recovered by hand ({FAULT_RECOVERED}={request})")
        return request

    def confirm_releases(self) -> None:
        for kind, entry in list(self.faults.items()):
            if entry.releasing and kind not in self.out.untaint:
                if kind in self.out.present:
                    self.out.untaint[kind] = "retrying the removal of a recovered fault's taint"
                else:
                    del self.faults[kind]

    def observe_taints(self) -> None:
        for kind, entry in list(self.faults.items()):
            if not entry.held:
                continue
            if kind in self.out.present and not entry.tainted:
                self.faults[kind] = replace(entry, tainted=True, manual_untaint=False)
            elif kind not in self.out.present and entry.tainted:
                self.faults[kind] = replace(entry, tainted=False, manual_untaint=True)
                message = (
                    f"the {kind} fault taint was removed by someone else: respected, the node is not "
                    "tainted again unless a new fault appears"
                )
                self.event(EV_UNTAINTED, message, "Normal")
                self.note(message)

    def age_baselines(self) -> None:
        if not self.ctx.data_ok:
            return
        for kind, baseline in list(self.baselines.items()):
            fault_kind = kind_of(kind)
            judged = self.by_uuid.get(fault_kind, {}) if fault_kind is not None else {}
            gpus: dict[str, Mapping[str, float]] = dict(baseline.gpus)
            if fault_kind is FaultKind.XID:
                at = parse_rfc3339(baseline.at)
                if at is None or self.ctx.now >= at + self.ctx.xid_memory_s:
                    gpus = {}
            elif fault_kind is FaultKind.ECC:
                gpus = {u: lowered(fp, judged[u]) if u in judged else fp for u, fp in gpus.items()}
                gpus = {u: fp for u, fp in gpus.items() if fp}
            elif fault_kind in (FaultKind.THERMAL, FaultKind.STRAGGLER, FaultKind.PCIE):
                gpus = {u: fp for u, fp in gpus.items() if not baseline_expired(fault_kind, judged.get(u))}
            if not gpus:
                del self.baselines[kind]
            elif gpus != baseline.gpus:
                self.baselines[kind] = replace(baseline, gpus=gpus)

    def lower_ecc_entry(self) -> None:
        entry = self.faults.get(FaultKind.ECC.value)
        if entry is None or not entry.held or not self.ctx.data_ok:
            return
        judged = self.by_uuid.get(FaultKind.ECC, {})
        changed = {
            g.uuid: fp
            for g in entry.gpus
            if g.uuid in judged and (fp := lowered(g.fingerprint, judged[g.uuid])) != g.fingerprint
        }
        if changed:
            self.faults[FaultKind.ECC.value] = with_fingerprints(entry, changed)

    def detect(self) -> None:
        if not self.ctx.data_ok:
            return
        for kind in KINDS:
            if not self.ctx.kinds[kind].enabled:
                continue
            faulty = [j for j in self.judgements.get(kind, ()) if j.state is GpuState.FAULT]
            if faulty:
                self._detect_kind(kind, faulty)

    def _detect_kind(self, kind: FaultKind, faulty: list[GpuJudgement]) -> None:
        entry = self.faults.get(kind.value)
        held = entry if entry is not None and entry.held else None
        if held is None:
            baseline = self.baselines.get(kind.value)
            at = parse_rfc3339(baseline.at) if baseline is not None else None
            refs: Mapping[str, Mapping[str, float]] = baseline.gpus if baseline is not None else {}
        else:
            at = parse_rfc3339(held.detected)
            refs = {g.uuid: g.fingerprint for g in held.gpus}
        fresh = [
            j
            for j in faulty
            if is_new(j, refs.get(j.uuid), at, now=self.ctx.now, xid_memory_s=self.ctx.xid_memory_s)
        ]
        if not fresh:
            if held is None:
                self.note(f"{kind} fault on {len(faulty)} GPU(s) already recovered by hand: not raised again")
            return
        gpus = tuple(_gpu_fault(j) for j in fresh)
        if held is None:
            # A new fault while the old one's taint is being released: keep the taint.
            self.out.untaint.pop(kind.value, None)
            self.announce.discard(kind.value)
            self.faults[kind.value] = FaultEntry(
                since=self.now_text,
                detected=self.now_text,
                gpus=sorted_gpus(gpus),
                tainted=kind.value in self.out.present,
            )
        else:
            self.faults[kind.value] = replace(
                held, detected=self.now_text, gpus=merge_gpus(held, gpus), manual_untaint=False
            )
            if kind is FaultKind.XID:  # the same XID again on a GPU (a flood): its count grows, silently
                gpus = tuple(
                    g for g in gpus if (old := held.gpu(g.uuid)) is None or old.fingerprint != g.fingerprint
                )
        self.out.new_kinds.append(kind.value)
        if not gpus:
            return
        mode = "" if self.ctx.enforce else " (Observe mode: the node is not tainted)"
        self.event(
            EV_FAULT,
            f"{kind} fault on {describe(sorted_gpus(gpus))}{xid_advice(kind, gpus)}{mode}",
            "Warning",
        )

    def recover_automatically(self) -> None:
        if not self.ctx.data_ok:
            return
        for kind in KINDS:
            rules = self.ctx.kinds[kind]
            entry = self.faults.get(kind.value)
            if entry is None or not entry.held or not rules.automatic or kind.value in self.out.new_kinds:
                continue
            if any(j.state is GpuState.FAULT for j in self.judgements.get(kind, ())):
                continue
            judged = self.by_uuid.get(kind, {})
            unknown = [
                j.reason for g in entry.gpus if (j := judged.get(g.uuid)) and j.state is GpuState.UNKNOWN
            ]
            if unknown:
                self.note(f"{kind} fault kept: automatic recovery needs data ({unknown[0]})")
            if not all(g.uuid in judged and judged[g.uuid].state is GpuState.HEALTHY for g in entry.gpus):
                continue
            if kind is not FaultKind.THERMAL:
                detected = parse_rfc3339(entry.detected)
                if detected is None or self.ctx.now - detected < rules.recovery_after_s:
                    continue
            self.note(f"{kind} fault recovered automatically")
            self.release(kind.value, entry, "the GPUs are healthy again (automatic recovery)")

    def taint_wishes(self) -> None:
        if not (self.ctx.enforce and self.ctx.data_ok):
            return
        for kind, entry in self.faults.items():
            fault_kind = kind_of(kind)
            if fault_kind is None or not entry.held or entry.manual_untaint:
                continue
            rules = self.ctx.kinds[fault_kind]
            if not (rules.enabled and rules.taints):
                continue
            devices = self.scope.devices_for(kind, entry)
            effect = self._drain(
                kind, entry, devices, self.scope.effect if devices is not None else rules.effect
            )
            if devices is not None:  # one DeviceTaintRule per faulty GPU, no node taint
                if self._held_as(kind, devices) == effect:
                    continue
                self.out.devices[kind] = devices
            elif self._held_as(kind, None) == effect:
                continue
            self.out.wants[kind] = effect
            if self.granted:  # recorded now: a removal before the next cycle is the admin's
                self.faults[kind] = replace(self.faults[kind], tainted=True)

    def _held_as(self, kind: str, devices: tuple[DraDevice, ...] | None) -> str | None:
        """The effect our quarantine for ``kind`` has now on its carrier (the node, or exactly
        ``devices``), or None when it is not (only) there."""
        if devices is None:
            return self.out.on_node.get(kind) if kind not in self.out.on_devices else None
        rules = self.scope.rules.get(kind, {})
        effects = set(rules.values())
        if kind in self.out.on_node or set(rules) != {d.key for d in devices} or len(effects) != 1:
            return None
        return effects.pop()

    def _unconfirmed(self, kind: str, entry: FaultEntry) -> str:
        """Why no second source confirms ``kind``'s fault yet ('' when one does; safety rule 9).

        Where both the node agent and a scrape target report a GPU, both must show the fault
        (``GpuJudgement.agrees``); where one source does, it must show it again in a sample newer
        than the fault's detection: the next scrape of the target (or reading of the agent), so one
        garbled or forged sample never drains. A tenant who forges a series on every scrape is
        stopped earlier, by the target check (``sources/metrics/targets.py``)."""
        fault_kind = kind_of(kind)
        judged = self.by_uuid.get(fault_kind, {}) if fault_kind is not None else {}
        detected = parse_rfc3339(entry.detected)
        confirmed = False
        for gpu in entry.gpus:
            j = judged.get(gpu.uuid)
            if j is None or j.state is not GpuState.FAULT:
                continue
            if j.agrees is False:
                return f"the node agent and Prometheus disagree on GPU {gpu.label}"
            if j.agrees or (detected is not None and j.newest > detected):
                confirmed = True
        return (
            ""
            if confirmed
            else "waiting for a second reading of the fault (the next scrape, or the node agent)"
        )

    def _set_drain(self, kind: str, since: str) -> None:
        entry = self.faults[kind]
        if entry.drain_since != since:
            self.faults[kind] = replace(entry, drain_since=since)

    def _drain(self, kind: str, entry: FaultEntry, devices: tuple[DraDevice, ...] | None, target: str) -> str:
        """The effect to wish for ``kind`` this cycle; a NoExecute target is drained toward (``drain``),
        once a second source agrees (``_unconfirmed``): until then the quarantine stays NoSchedule."""
        held_as = self._held_as(kind, devices)
        if target == HARD and held_as != HARD and not entry.drain_since:
            why = self._unconfirmed(kind, entry)
            if why:
                self.note(f"{kind} fault: no drain and no NoExecute yet: {why}")
                return SOFT
        if target != HARD or self.drain.timeout_s <= 0 or held_as != SOFT:
            self._set_drain(kind, "")  # no drain, done (hard in place), or not begun (soft form first)
            return SOFT if target == HARD and self.drain.timeout_s > 0 and held_as != HARD else target
        since = parse_rfc3339(entry.drain_since) if entry.drain_since else None
        where = "its DeviceTaintRule(s)" if devices is not None else "the node taint"
        if since is None:
            since = self.ctx.now
            self._set_drain(kind, self.now_text)
            self.event(
                EV_DRAIN,
                f"draining the pods off the {kind} fault on {describe(entry.gpus)} through the Eviction API "
                f"(PodDisruptionBudgets honoured) before {where} become(s) NoExecute, "
                f"at most {self.drain.timeout_s:.0f}s",
                "Warning",
            )
        step = drain_step(kind, devices, since, self.ctx.now, self.drain)
        if step.upgrade:
            self.event(
                EV_DRAIN, f"drain of the {kind} fault over ({step.why}): {where} set to NoExecute", "Warning"
            )
            return HARD
        self.note(f"{kind} fault: {step.why}")
        for pod in step.evict:
            gpus = ", ".join(f"GPU {g.label}" for g in entry.gpus)
            self.out.drains.append(
                DrainPod(
                    namespace=pod.namespace,
                    name=pod.name,
                    uid=pod.uid,
                    node=self.node.name,
                    reason=(
                        f"evicted: {gpus} on node {self.node.name} has a {kind} fault "
                        f"({describe(entry.gpus)}); drained before {FAULT_TAINT_KEY}={kind}:NoExecute"
                    ),
                )
            )
        return SOFT

    def condition(self) -> None:
        """GPUHealthy for the faults held, GPUDegraded for the degraded kinds (a straggler, a PCIe link)."""
        held = {k: e for k, e in self.faults.items() if e.held}
        degraded = {k: e for k, e in held.items() if (fk := kind_of(k)) is not None and fk.degraded}
        broken = {k: e for k, e in held.items() if k not in degraded}
        self._condition(
            GPU_HEALTHY,
            _fault_condition(broken, self.ctx, "False") if broken else None,
            ("True", REASON_CLEARED, "no GPU fault is held on this node by gpu-efficiency-operator"),
            FAULT_REASON_PREFIX,
        )
        self._condition(
            GPU_DEGRADED,
            _fault_condition(degraded, self.ctx, "True") if degraded else None,
            (
                "False",
                REASON_DEGRADED_CLEARED,
                "no GPU is held degraded on this node by gpu-efficiency-operator",
            ),
            DEGRADED_REASON_PREFIX,
        )

    def _condition(
        self, type_: str, held: tuple[str, str, str] | None, cleared: tuple[str, str, str], ours: str
    ) -> None:
        current = next((c for c in self.node.conditions if c.type == type_), None)
        if held is not None:
            desired = held
        elif current is not None and current.status != cleared[0] and current.reason.startswith(ours):
            desired = cleared
        else:
            return
        if current is None or (current.status, current.reason, current.message) != desired:
            status, reason, message = desired
            self.out.writes.append(
                SetNodeCondition(
                    node=self.node.name, status=status, reason=reason, message=message, type=type_
                )
            )

    def record(self, request: str | None) -> None:
        text = dump_record(NodeFaultRecord(faults=self.faults, baselines=self.baselines))
        annotations: dict[str, str | None] = {}
        if text != self.raw:
            annotations[NODE_FAULTS] = text
        if request is not None:
            annotations[FAULT_RECOVERED] = None
        if annotations:
            self.out.writes.append(AnnotateNode(node=self.node.name, annotations=annotations))

    def run(self) -> NodeDecision:
        request = self.manual_recovery()
        self.confirm_releases()
        self.observe_taints()
        self.age_baselines()
        self.lower_ecc_entry()
        self.detect()
        self.recover_automatically()
        self.taint_wishes()
        self.condition()
        self.record(request)
        for kind in sorted(self.announce, key=kind_order):
            self.event(EV_UNTAINTED, f"removed the {kind} fault taint: {self.out.untaint[kind]}", "Normal")
        self.out.held = {k: e for k, e in self.faults.items() if e.held}
        return self.out


def _fault_condition(held: Mapping[str, FaultEntry], ctx: FaultContext, status: str) -> tuple[str, str, str]:
    kinds = sorted(held, key=kind_order)
    if len(kinds) == 1:
        known = kind_of(kinds[0])
        reason = known.condition_reason if known is not None else FAULT_REASON_PREFIX + kinds[0].capitalize()
    else:  # GPUDegraded keeps its own prefix: only reasons starting with it are ours to clear
        reason = REASON_DEGRADED_MULTIPLE if status == "True" else REASON_MULTIPLE
    parts = [
        f"{kind} fault on {describe(held[kind].gpus)} since {held[kind].since}{xid_advice(kind, held[kind].gpus)}"
        for kind in kinds
    ]
    manual = [k for k in kinds if (fk := kind_of(k)) is None or not ctx.kinds[fk].automatic]
    if manual:
        parts.append(f"after repair, annotate the node {FAULT_RECOVERED}={'|'.join(manual)} or all")
    message = "; ".join(parts)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 20].rstrip() + "... (truncated)"
    return status, reason, message


def decide_node(
    node: NodeView,
    judgements: Mapping[FaultKind, Sequence[GpuJudgement]],
    ctx: FaultContext,
    *,
    granted: bool = False,
    scope: DeviceScope = NO_SCOPE,
    drain: DrainContext = NO_DRAIN,
) -> NodeDecision:
    """The node's fault state after this cycle, and the writes and events it needs (taints excepted).

    ``granted``: the circuit breaker lets this node's taint wishes through, so the record marks
    those faults tainted in the same write (see ``evaluate_faults``). ``scope``: the node's DRA
    GPUs and our device rules (``devices``): a single-GPU fault is wished on its devices.
    ``drain``: the pods a NoExecute wish drains first (``drain``).
    """
    return _NodeCycle(node, judgements, ctx, granted=granted, scope=scope, drain=drain).run()
