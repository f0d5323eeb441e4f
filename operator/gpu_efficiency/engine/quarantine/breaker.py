"""Circuit breaker: never hold more than a share of the GPU nodes tainted at once.

Mass faults are more likely bad data (an exporter bug, a broken rule) than mass hardware failure,
and tainting half the cluster is worse than leaving a faulty node schedulable for a while. The
budget is ``floor(maxTaintedFraction * in-scope GPU nodes)``, at least 1 when the fraction is above
zero (a single bad GPU in a small cluster is still quarantined), then capped by
``maxTaintedNodes``. Nodes already carrying our taint use the budget first (they are never
untainted to make room); a node that already has our taint may take another kind freely (the
count of tainted nodes does not change). New nodes are chosen worst fault first (ecc, xid,
thermal), then by name, so the choice is deterministic across replicas and restarts.

GPUs are capped too (``gpu_budget``): ``floor(maxQuarantinedGpuFraction * in-scope GPUs)`` (the
fraction defaults to ``maxTaintedFraction``), where
a node taint takes every GPU of its node and a DeviceTaintRule one GPU. A node whose wishes would
take more GPUs than it holds now (a new quarantine, a second faulty device, a device fault moving
to the node) needs room under both caps; one that takes no more GPUs (a stronger effect, a kind
joining a node taint) always passes. While the fraction is above zero the budget is
at least the GPUs of the largest in-scope node, as one node always may be tainted.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpu_efficiency.api.policy import CircuitBreaker
from gpu_efficiency.engine.quarantine.record import kind_order


def gpu_budget(capacities: Collection[int], breaker: CircuitBreaker) -> int:
    """How many in-scope GPUs may be quarantined at once (node taints count all their node's GPUs),
    given each in-scope node's GPU count: at least the largest node's GPUs while the fraction is
    above zero, as one node always may be tainted."""
    gpus = sum(capacities)
    if gpus <= 0 or breaker.gpu_fraction <= 0:
        return 0
    return max(max(capacities), math.floor(breaker.gpu_fraction * gpus + 1e-9))


def taint_budget(gpu_nodes: int, breaker: CircuitBreaker) -> int:
    """How many in-scope GPU nodes may carry our taint at once."""
    if gpu_nodes <= 0:
        return 0
    budget = math.floor(breaker.max_tainted_fraction * gpu_nodes + 1e-9)
    if breaker.max_tainted_fraction > 0:
        budget = max(1, budget)
    if breaker.max_tainted_nodes is not None:
        budget = min(budget, breaker.max_tainted_nodes)
    return budget


@dataclass(frozen=True, slots=True)
class GpuCost:
    """GPUs a node's quarantine takes now and would take with its wishes granted."""

    now: int
    after: int


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    granted: frozenset[str]  # nodes whose taint wishes are applied
    denied: tuple[str, ...]  # faulty nodes left untainted, in priority order
    budget: int
    tainted_now: int  # in-scope nodes carrying our taint at the start of the cycle
    gpu_budget: int | None = None  # None: GPUs are not capped
    gpus_now: int = 0  # in-scope GPUs quarantined at the start of the cycle

    @property
    def open(self) -> bool:
        return bool(self.denied)


def decide_taints(
    wishes: Mapping[str, Collection[str]],
    tainted_now: Collection[str],
    budget: int,
    *,
    gpus: Mapping[str, GpuCost] | None = None,
    gpu_cap: int | None = None,
) -> BreakerDecision:
    """Grant wishes (node -> kinds) within the node budget and, given ``gpus`` and ``gpu_cap``, the
    GPU budget; nodes already tainted pass unless their wishes take more GPUs."""
    costs = gpus or {}
    gpus_held = sum(c.now for c in costs.values())

    def growth(node: str) -> int:
        cost = costs.get(node)
        return max(0, cost.after - cost.now) if cost is not None and gpu_cap is not None else 0

    granted = {node for node in wishes if node in tainted_now and growth(node) == 0}
    candidates = sorted(
        (node for node in wishes if node not in granted),
        key=lambda node: (min(kind_order(k) for k in wishes[node]), node),
    )
    nodes_held = len(tainted_now)
    denied: list[str] = []
    for node in candidates:
        new_node = node not in tainted_now
        more = growth(node)
        if new_node and nodes_held >= budget:
            denied.append(node)
            continue
        if gpu_cap is not None and gpus_held + more > gpu_cap:
            denied.append(node)
            continue
        granted.add(node)
        nodes_held += new_node
        gpus_held += more
    return BreakerDecision(
        granted=frozenset(granted),
        denied=tuple(denied),
        budget=budget,
        tainted_now=len(tainted_now),
        gpu_budget=gpu_cap,
        gpus_now=sum(c.now for c in costs.values()),
    )


def breaker_message(
    decision: BreakerDecision, gpu_nodes: int, breaker: CircuitBreaker, gpus: int | None = None
) -> str:
    """One sentence for the policy condition and the events."""
    cap = f"maxTaintedFraction {breaker.max_tainted_fraction:g}"
    if breaker.max_tainted_nodes is not None:
        cap += f", maxTaintedNodes {breaker.max_tainted_nodes}"
    shown = ", ".join(decision.denied[:10]) + (" ..." if len(decision.denied) > 10 else "")
    text = (
        f"{len(decision.denied)} faulty node(s) left untainted: at most {decision.budget} of {gpu_nodes} "
        f"GPU nodes may be tainted ({cap}) and {decision.tainted_now} already are"
    )
    if decision.gpu_budget is not None and gpus is not None:
        text += (
            f"; at most {decision.gpu_budget} of {gpus} GPUs may be quarantined (maxQuarantinedGpuFraction "
            f"{breaker.gpu_fraction:g}) and {decision.gpus_now} already are"
        )
    return f"{text}: {shown}"
