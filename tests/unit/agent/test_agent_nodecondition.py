"""GPUHealthy: what the agent wants the node to say, and the patch that keeps lastTransitionTime."""

from __future__ import annotations

from gpu_efficiency.agent.collect import GpuReading
from gpu_efficiency.agent.faults import GpuFaults
from gpu_efficiency.agent.nodecondition import CONDITION_TYPE, Condition, condition_patch, desired_condition
from gpu_efficiency.agent.nvml.types import DeviceInfo
from gpu_efficiency.agent.state import GpuView

CRITICAL = {48, 79}


def view(index: int, faults: GpuFaults | None = None, mig: bool = False, **values: float) -> GpuView:
    device = DeviceInfo(
        index=index,
        uuid=f"MIG-{index}" if mig else f"GPU-{index}",
        name="H100",
        pci_bus_id="",
        parent_uuid=f"GPU-{index}" if mig else None,
        gpu_instance_id=1 if mig else None,
    )
    return GpuView(GpuReading(device, 0.0, {"ecc_dbe_volatile": 0, **values}, {}), faults or GpuFaults(), ())


def test_healthy() -> None:
    got = desired_condition(
        [view(0), view(1), view(1, mig=True)], ready=True, ready_reason="", critical_xids=CRITICAL
    )
    assert got == Condition("True", "GPUsHealthy", "2 GPU(s) without XID, double-bit ECC or remap faults")


def test_critical_xid_names_gpu_even_after_a_later_benign_xid() -> None:
    faults = GpuFaults(last_xid=13, xid_events=2, xid_codes=(79, 13))
    got = desired_condition([view(0), view(1, faults)], ready=True, ready_reason="", critical_xids=CRITICAL)
    assert (got.status, got.reason) == ("False", "XidCriticalError")
    assert got.message == "GPU 1 (GPU-1): critical XID 79"


def test_benign_xid_is_healthy() -> None:
    faults = GpuFaults(last_xid=13, xid_events=1, xid_codes=(13,))
    assert (
        desired_condition([view(0, faults)], ready=True, ready_reason="", critical_xids=CRITICAL).status
        == "True"
    )


def test_dbe_and_remap_failure_listed_with_xid_first() -> None:
    views = [view(0, GpuFaults(dbe_events=1)), view(1, row_remap_failure=1.0), view(2, ecc_dbe_volatile=3)]
    views.append(view(3, GpuFaults(xid_codes=(48,), last_xid=48)))
    got = desired_condition(views, ready=True, ready_reason="", critical_xids=CRITICAL)
    assert got.reason == "XidCriticalError"
    assert got.message.split("; ") == [
        "GPU 3 (GPU-3): critical XID 48",
        "GPU 0 (GPU-0): 1 double-bit ECC error(s)",
        "GPU 2 (GPU-2): 3 double-bit ECC error(s)",
        "GPU 1 (GPU-1): row remapping failed",
    ]


def test_nvml_down_is_unknown_not_healthy() -> None:
    got = desired_condition([], ready=False, ready_reason="NVML init failed: X", critical_xids=CRITICAL)
    assert got == Condition("Unknown", "NVMLUnavailable", "NVML init failed: X")


def test_patch_only_on_change_and_keeps_transition_time_while_status_holds() -> None:
    bad = Condition("False", "XidCriticalError", "GPU 1 (GPU-1): critical XID 79")
    first = condition_patch(bad, None, "2026-01-01T00:00:00Z")
    assert first is not None
    (cond,) = first["status"]["conditions"]
    assert cond == {
        "type": CONDITION_TYPE,
        "status": "False",
        "reason": "XidCriticalError",
        "message": bad.message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
    }
    current = {k: str(v) for k, v in cond.items()}
    assert condition_patch(bad, current, "2026-01-01T00:05:00Z") is None  # steady state: no write
    worse = Condition("False", "XidCriticalError", bad.message + "; GPU 2 (GPU-2): critical XID 48")
    patch = condition_patch(worse, current, "2026-01-01T00:06:00Z")
    assert patch is not None
    assert patch["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    healed = condition_patch(Condition("True", "GPUsHealthy", "ok"), current, "2026-01-01T01:00:00Z")
    assert healed is not None
    assert healed["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T01:00:00Z"


def test_never_fights_the_operators_condition() -> None:
    operator_false = {
        "status": "False",
        "reason": "GPUFaultThermal",
        "message": "thermal fault on GPU 0 since ...",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    xid = Condition("False", "XidCriticalError", "GPU 1 (GPU-1): critical XID 79")
    healthy = Condition("True", "GPUsHealthy", "8 GPU(s) ...")
    assert condition_patch(xid, operator_false, "2026-01-01T00:01:00Z") is None
    assert condition_patch(healthy, operator_false, "2026-01-01T00:01:00Z") is None
    cleared = {"status": "True", "reason": "GPUFaultCleared", "message": "no GPU fault is held ..."}
    assert condition_patch(healthy, cleared, "2026-01-01T00:02:00Z") is None  # True either way: no churn
    patch = condition_patch(xid, cleared, "2026-01-01T00:03:00Z")  # a new fault is news, whoever said True
    assert patch is not None
    assert patch["status"]["conditions"][0]["reason"] == "XidCriticalError"
