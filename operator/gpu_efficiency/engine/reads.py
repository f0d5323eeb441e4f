"""What a cycle must read before it can plan: the engine's answer, so the runtime holds no rule.

The runtime reads nodes first (the fault hints name the nodes already held), then the pods and the
metrics at once, then the owners and the DRA objects when this answer says they matter. Every
duration comes from the spec's parsed ``Duration`` values, so nothing here parses a string.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import DeviceTaintEffect, GPUEfficiencyPolicySpec
from gpu_efficiency.engine.model import NamespaceView, NodeView, PodView, Window
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.quarantine.xid_repeats import FLOOD_WINDOW_S
from gpu_efficiency.engine.reclaim.ownerreads import OwnerRead, owner_read_needed
from gpu_efficiency.engine.selection import build_scope


def windows_for(spec: GPUEfficiencyPolicySpec) -> dict[Window, float]:
    """The aggregation windows a policy needs, in seconds."""
    windows = {Window.ACTIVITY: spec.window.seconds}
    if spec.faults.enabled:
        windows[Window.FAULT] = spec.faults.lookback.seconds
        if spec.faults.thermal.enabled:
            windows[Window.THERMAL_HOLD] = spec.faults.thermal.for_duration.seconds
            windows[Window.THERMAL_RECOVERY] = spec.faults.thermal.recovery_after.seconds
    return windows


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """One cycle's reads: the metric fetch (windows, sample density, which fault series may be
    skipped, which activity may come from a cache), the DRA reads, and when owners are needed."""

    spec: GPUEfficiencyPolicySpec
    windows: Mapping[Window, float]
    scrape_interval_s: float
    #: Fault hints: fetch a GPU's fault windows only when it runs hotter than these (None: no
    #: thermal rule), when its node is already held, or over these XID counting windows.
    gpu_temperature_above: float | None
    memory_temperature_above: float | None
    held_nodes: frozenset[str]
    xid_windows: tuple[float, ...]
    #: GPUs below this activity could be judged idle: always fetched fresh.
    idle_below: float
    #: Read the DRA devices and our DeviceTaintRules (fault quarantine is on).
    dra: bool
    #: Also read who holds each device: only a NoExecute drain needs it.
    dra_claims: bool

    def owners(
        self,
        *,
        pods: Iterable[PodView],
        namespaces: Iterable[NamespaceView],
        nodes: Iterable[NodeView],
        protected_namespaces: frozenset[str],
        now: float,
    ) -> OwnerRead:
        """What this cycle needs of the pods' owners (``pods/ownerreads.py``); straggler events go
        to the job's top owner, so the last read at least when stragglers are on."""
        scope = build_scope(self.spec.selection, protected_namespaces, namespaces, nodes)
        need = owner_read_needed(pods, scope, now, cycle_params(self.spec))
        if self.spec.stragglers.enabled and need is OwnerRead.NONE:
            return OwnerRead.CACHED
        return need


def reads(spec: GPUEfficiencyPolicySpec, *, nodes: Iterable[NodeView]) -> ReadPlan:
    """What to read for ``spec`` this cycle, given the nodes (read first)."""
    faults = spec.faults
    hot = faults.enabled and faults.thermal.enabled
    xid_windows: tuple[float, ...] = ()
    if faults.enabled and faults.xid.enabled:
        repeats = (r.within.seconds for r in faults.xid.repeat)
        xid_windows = (faults.lookback.seconds, FLOOD_WINDOW_S, *repeats)
    return ReadPlan(
        spec=spec,
        windows=windows_for(spec),
        scrape_interval_s=spec.metrics.prometheus.scrape_interval.seconds,
        gpu_temperature_above=faults.thermal.gpu_temperature_above if hot else None,
        memory_temperature_above=faults.thermal.memory_temperature_above if hot else None,
        held_nodes=frozenset(n.name for n in nodes if names.NODE_FAULTS in n.annotations),
        xid_windows=xid_windows,
        idle_below=spec.idle.activity_below,
        dra=faults.enabled,
        dra_claims=faults.device_quarantine.effect is DeviceTaintEffect.NO_EXECUTE,
    )
