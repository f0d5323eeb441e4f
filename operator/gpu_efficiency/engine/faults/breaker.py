"""Circuit breaker: never hold more than a share of the GPU nodes tainted at once.

Mass faults are more likely bad data (an exporter bug, a broken rule) than mass hardware failure,
and tainting half the cluster is worse than leaving a faulty node schedulable for a while. The
budget is ``floor(maxTaintedFraction * in-scope GPU nodes)``, at least 1 when the fraction is above
zero (a single bad GPU in a small cluster is still quarantined), then capped by
``maxTaintedNodes``. Nodes already carrying our taint use the budget first (they are never
untainted to make room); a node that already has our taint may take another kind freely (the
count of tainted nodes does not change). New nodes are chosen worst fault first (ecc, xid,
thermal), then by name, so the choice is deterministic across replicas and restarts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpu_efficiency.api.policy import CircuitBreaker
from gpu_efficiency.engine.faults.record import kind_order


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
class BreakerDecision:
    granted: frozenset[str]  # nodes whose taint wishes are applied
    denied: tuple[str, ...]  # faulty nodes left untainted, in priority order
    budget: int
    tainted_now: int  # in-scope nodes carrying our taint at the start of the cycle

    @property
    def open(self) -> bool:
        return bool(self.denied)


def decide_taints(
    wishes: Mapping[str, Collection[str]], tainted_now: Collection[str], budget: int
) -> BreakerDecision:
    """Grant wishes (node -> kinds) within the budget; nodes already tainted always pass."""
    granted = {node for node in wishes if node in tainted_now}
    candidates = sorted(
        (node for node in wishes if node not in tainted_now),
        key=lambda node: (min(kind_order(k) for k in wishes[node]), node),
    )
    room = max(0, budget - len(tainted_now))
    granted.update(candidates[:room])
    return BreakerDecision(
        granted=frozenset(granted),
        denied=tuple(candidates[room:]),
        budget=budget,
        tainted_now=len(tainted_now),
    )


def breaker_message(decision: BreakerDecision, gpu_nodes: int, breaker: CircuitBreaker) -> str:
    """One sentence for the policy condition and the events."""
    cap = f"maxTaintedFraction {breaker.max_tainted_fraction:g}"
    if breaker.max_tainted_nodes is not None:
        cap += f", maxTaintedNodes {breaker.max_tainted_nodes}"
    shown = ", ".join(decision.denied[:10]) + (" ..." if len(decision.denied) > 10 else "")
    return (
        f"{len(decision.denied)} faulty node(s) left untainted: at most {decision.budget} of {gpu_nodes} "
        f"GPU nodes may be tainted ({cap}) and {decision.tainted_now} already are: {shown}"
    )
