"""What a cycle settles into, seen from outside: the tainted-nodes gauge names every fault kind
(the metrics view once hard-coded three of five), and an invalid spec's event goes out once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.unit.engine import builders as b

from gpu_efficiency import metrics
from gpu_efficiency.api import names
from gpu_efficiency.engine.model import PolicyEvent
from gpu_efficiency.engine.quarantine.kinds import FaultKind

from .cycle_harness import ENFORCE_SPEC, run_cycle, runner


@pytest.fixture(autouse=True)
def fresh_gauge() -> Iterator[None]:
    metrics.TAINTED_NODES.clear()
    yield
    metrics.TAINTED_NODES.clear()


def _tainted(policy: str) -> dict[str, float]:
    return {
        s.labels["kind"]: s.value
        for metric in metrics.TAINTED_NODES.collect()
        for s in metric.samples
        if s.labels.get("policy") == policy
    }


def test_the_tainted_nodes_gauge_exports_every_fault_kind_at_zero() -> None:
    spec = {**ENFORCE_SPEC, "faults": {"enabled": True}}
    run_cycle(runner([b.gpu("GPU-0", b.compute_bound(), ("team-a", "train"))], [b.pod("train")]), spec=spec)
    assert _tainted("truth") == {kind.value: 0.0 for kind in FaultKind}


def test_an_invalid_spec_warns_once_per_message() -> None:
    cycle_runner = runner([], [])
    bad = {"window": "ten minutes"}
    run_cycle(cycle_runner, spec=bad)
    run_cycle(cycle_runner, spec=bad)
    applied = cycle_runner.applier.applied  # type: ignore[attr-defined]
    invalid = [a for a in applied if isinstance(a, PolicyEvent) and a.reason == names.EV_POLICY_INVALID]
    assert len(invalid) == 1
    assert "spec.window" in invalid[0].message
