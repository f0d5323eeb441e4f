"""The cycle asks the DRA reader for ResourceClaims only for a policy whose device taints are
NoExecute: only its drain needs to know who holds a faulty device, and a claims LIST every cycle
during any quarantine would end "a steady cycle makes no API read"."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.runtime import cycle_harness as h

from gpu_efficiency.sources.kube.dra import DraState


class CountingDra:
    def __init__(self) -> None:
        self.requests = 0
        self.claims_asked = 0

    def read(self) -> DraState:
        return DraState()

    def with_claims(self, state: DraState) -> DraState:
        self.claims_asked += 1
        return state

    def rules_written(self) -> None:
        return None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


@pytest.mark.parametrize(("effect", "asked"), [("NoSchedule", 0), ("NoExecute", 1)])
def test_claims_are_asked_for_only_by_a_no_execute_device_quarantine(effect: str, asked: int) -> None:
    run = h.runner([h.b.gpu("GPU-a-0", h.b.compute_bound(), ("team-a", "a"))], [h.b.pod("a")])
    dra = CountingDra()
    run.dra = dra  # type: ignore[assignment]
    spec: dict[str, Any] = {**h.ENFORCE_SPEC, "faults": {"deviceQuarantine": {"effect": effect}}}
    h.run_cycle(run, spec=spec)
    assert dra.claims_asked == asked
