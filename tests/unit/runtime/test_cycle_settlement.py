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

from .cycle_harness import ENFORCE_SPEC, run_cycle, runner, warned_idle_pod


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


def test_a_notification_that_cannot_be_drafted_never_fails_the_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Notifications are a side channel: a bug while drafting them is logged, and the cycle still
    settles, applies its writes and keeps its status, without notifications."""
    import importlib

    from gpu_efficiency.actuators.notify.delivery import Notifier

    settle_module = importlib.import_module("gpu_efficiency.engine.settle")

    def broken(*_: object, **__: object) -> list[object]:
        raise RuntimeError("a notification the drafting code cannot build")

    monkeypatch.setattr(settle_module, "_notifications", broken)
    cycle_runner = runner([b.gpu("GPU-0", b.idle(), ("team-a", "nb"))], [warned_idle_pod("nb", b.NOW)])
    cycle_runner.notifier = Notifier(post=lambda *_a, **_k: None)  # type: ignore[arg-type]
    spec = {**ENFORCE_SPEC, "notify": [{"name": "team", "type": "CloudEvents", "urlSecretKey": "team-url"}]}
    report = cycle_runner.run(name="side", uid="uid-side", generation=1, spec_raw=spec, status_raw={})
    assert report.ran
    assert report.status is not None
    assert report.writes > 0
