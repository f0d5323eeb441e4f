"""The status writer skips writes whose only change is a figure that grows every cycle (GPU-hours
idle or returned, the evaluation time), so a steady cluster costs no status write per cycle; a real
change, or the refresh period, still writes."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from gpu_efficiency.actuators.status import StatusWriter


def status(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "lastEvaluationTime": "2026-11-24T21:00:00Z",
        "idleGpuHours": 1.0,
        "gpuHoursReturned": 2.0,
        "reclaimsTotal": 1,
        "reclamations": [{"owner": "ml/Deployment/nb", "action": "ScaleToZero", "gpuHoursReturned": 2.0}],
    }
    body.update(changes)
    return body


def test_growing_figures_alone_wait_for_the_refresh_but_a_real_change_writes() -> None:
    writer = StatusWriter(client.ApiClient(), refresh_seconds=300)
    writer.seed("p", status())
    grown = status(
        lastEvaluationTime="2026-11-24T21:00:05Z",
        idleGpuHours=1.1,
        gpuHoursReturned=2.1,
        reclamations=[{"owner": "ml/Deployment/nb", "action": "ScaleToZero", "gpuHoursReturned": 2.1}],
    )
    now = writer._last["p"][1]
    assert not writer.needs_write("p", grown, now=now + 5)
    assert writer.needs_write("p", grown, now=now + 301)
    returned = status(
        reclamations=[{"owner": "ml/Deployment/nb", "action": "ScaleToZero", "returned": False}]
    )
    assert writer.needs_write("p", returned, now=now + 5)
    assert writer.needs_write("p", status(reclaimsTotal=2), now=now + 5)
