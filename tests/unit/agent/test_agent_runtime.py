"""Agent lifecycle over real HTTP: NVML init failure and retries, NVML loss, staleness, fault events."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.agent.nvml.types import DeviceInfo, EventKind, NvmlCode
from gpu_efficiency.agent.pods import AttributionResult, Attributor
from gpu_efficiency_sim.fake_nvml.backend import FakeGpu


def _metric(http: httpx.Client, url: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(http.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_init_failure_keeps_agent_up_not_ready_and_retries_with_backoff(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(1)
    backend.fail_next("init", NvmlCode.DRIVER_NOT_LOADED, times=4)
    attempts: list[float] = []
    real_init = backend.init

    def init() -> None:
        attempts.append(time.monotonic())
        real_init()

    backend.init = init  # type: ignore[method-assign]
    _, url = serve(backend, ready=False, backoff_initial_s=0.1, backoff_max_s=0.4)
    r = wait_until(lambda: (resp := http.get(f"{url}/readyz")).status_code == 503 and resp)
    assert "NVML init failed: NVML_ERROR_DRIVER_NOT_LOADED" in r.text
    assert http.get(f"{url}/healthz").status_code == 200  # alive while NVML is down
    wait_until(lambda: http.get(f"{url}/readyz").status_code == 200)
    assert len(attempts) == 5
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[2] > gaps[0] * 2  # exponential: about 0.1, 0.2, 0.4 ...
    assert gaps[3] < 0.4 + 0.2  # ... up to the cap
    assert _metric(http, url, "gpu_efficiency_agent_nvml_init_failures_total") == 4.0
    assert _metric(http, url, "gpu_efficiency_agent_nvml_ready") == 1.0


def test_nvml_never_available_serves_metrics_and_says_why(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(1)
    backend.fail_next("init", NvmlCode.LIBRARY_NOT_FOUND, times=10_000)
    _, url = serve(backend, ready=False)
    wait_until(lambda: (_metric(http, url, "gpu_efficiency_agent_nvml_init_failures_total") or 0) >= 2)
    r = http.get(f"{url}/readyz")
    assert r.status_code == 503
    assert "LIBRARY_NOT_FOUND" in r.text
    assert "next retry" in r.text
    assert _metric(http, url, "DCGM_FI_DEV_GPU_UTIL") is None  # no data is not zero
    snap = http.get(f"{url}/snapshot").json()
    assert snap["ready"] is False
    assert snap["gpus"] == []


def test_lost_nvml_reinitialises(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(1)
    _, url = serve(backend, rescan_interval_s=0.05)
    backend.fail_next("devices", NvmlCode.GPU_IS_LOST, times=3)
    wait_until(lambda: backend.init_calls >= 2)
    wait_until(lambda: http.get(f"{url}/readyz").status_code == 200)
    assert _metric(http, url, "DCGM_FI_DEV_GPU_TEMP") == 32.0


def test_stale_samples_make_the_agent_unready(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend(1)
    _, url = serve(backend, interval_s=0.05)
    real = backend.utilization
    monkeypatch.setattr(backend, "utilization", lambda uuid: (time.sleep(0.5), real(uuid))[1])
    r = wait_until(lambda: (resp := http.get(f"{url}/readyz")).status_code == 503 and resp)
    assert "latest sample" in r.text


def test_xid_and_dbe_events_show_within_a_second(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(2)
    uuid = backend.gpus[1].uuid
    _, url = serve(backend, interval_s=1.0, event_poll_s=0.5)  # production timings
    assert _metric(http, url, "DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 0.0
    sent = time.monotonic()
    backend.inject(uuid, EventKind.XID, 79)
    wait_until(
        lambda: _metric(http, url, "DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 79.0, timeout=2.0, step=0.02
    )
    assert time.monotonic() - sent < 1.0
    sent = time.monotonic()
    backend.inject(uuid, EventKind.DBE)
    wait_until(
        lambda: _metric(http, url, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", UUID=uuid) == 1.0, timeout=2.0, step=0.02
    )
    assert time.monotonic() - sent < 1.0  # the event wakes the sampler instead of waiting for the next tick
    snap = http.get(f"{url}/snapshot?history=0").json()
    faulty = next(g for g in snap["gpus"] if g["uuid"] == uuid)
    assert faulty["faults"]["last_xid"] == 79
    assert faulty["faults"]["xid_codes"] == [79]
    assert faulty["faults"]["dbe_events"] == 1
    assert [(e["kind"], e["data"]) for e in snap["events"]] == [("xid", 79), ("dbe", 0)]
    assert _metric(http, url, "gpu_efficiency_agent_nvml_events_total", kind="xid") == 1.0


def test_recent_events_are_bounded(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(1)
    agent, url = serve(backend, max_events=3)
    for xid in (13, 31, 43, 48, 79):
        backend.inject(0, EventKind.XID, xid)
    wait_until(lambda: agent.faults.get(backend.gpus[0].uuid).xid_events == 5)
    assert [e["data"] for e in http.get(f"{url}/snapshot").json()["events"]] == [43, 48, 79]
    assert agent.faults.get(backend.gpus[0].uuid).xid_codes == (13, 31, 43, 48, 79)


def test_gpu_without_event_support_is_named(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(2)
    backend.fail(1, "events", NvmlCode.NOT_SUPPORTED)
    _, url = serve(backend)
    docs = {g["index"]: g for g in http.get(f"{url}/snapshot").json()["gpus"]}
    assert docs["0"]["events_error"] is None
    assert docs["1"]["events_error"] == "NVML_ERROR_NOT_SUPPORTED"


def test_rescan_follows_mig_reconfiguration(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    backend = make_backend(1)
    _, url = serve(backend, rescan_interval_s=0.05)
    assert len(http.get(f"{url}/snapshot").json()["gpus"]) == 1
    parent = backend.gpus[0]
    child = FakeGpu(index=0, uuid="MIG-a", parent_uuid=parent.uuid, gpu_instance_id=1, mig_profile="3g.40gb")
    backend.update(0, mig=[child])
    docs = wait_until(lambda: (g := http.get(f"{url}/snapshot").json()["gpus"]) and len(g) == 2 and g)
    mig = next(d for d in docs if d["mig"])
    assert mig["index"] == "0/1"
    assert mig["mig"]["parent_uuid"] == parent.uuid
    backend.update(0, mig=[])
    wait_until(lambda: len(http.get(f"{url}/snapshot").json()["gpus"]) == 1)


def test_attribution_survives_a_failing_pass(
    serve: Callable[..., Any],
    make_backend: Callable[[int], Any],
    http: httpx.Client,
    wait_until: Callable[..., Any],
) -> None:
    """A pass that raises (a bug, a device gone mid-pass) is counted and logged; the loop goes on
    and the next pass's answer is served (the thread used to die, and attribution with it)."""
    backend = make_backend(1)

    class Flaky(Attributor):
        passes = 0

        def resolve(self, devices: list[DeviceInfo]) -> AttributionResult:
            Flaky.passes += 1
            if Flaky.passes == 1:
                raise RuntimeError("boom")
            return AttributionResult({}, "static")

    _, url = serve(backend, Flaky(backend), attribution_interval_s=0.05)
    wait_until(lambda: http.get(f"{url}/snapshot").json()["attribution"]["source"] == "static")
    assert Flaky.passes >= 2
    assert (_metric(http, url, "gpu_efficiency_agent_attribution_errors_total") or 0.0) >= 1.0
