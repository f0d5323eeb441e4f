"""HTTP outputs: /metrics as dcgm-exporter writes it, /snapshot's schema, probes and errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.agent.fields import FIELDS, HISTORY_SIGNALS, XID_METRIC
from gpu_efficiency.agent.nvml.types import Probe
from gpu_efficiency.agent.pods import Attributor, parse_static
from gpu_efficiency.agent.snapshot import SCHEMA
from gpu_efficiency_sim.fake_nvml.backend import IDLE_GPM, FakeBackend, FakeGpu

DCGM_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "namespace",
    "pod",
}


@pytest.fixture
def two_gpus_with_pods(
    serve: Callable[..., Any], wait_until: Callable[..., Any], http: httpx.Client
) -> tuple[FakeBackend, str]:
    busy = FakeGpu(
        index=0, uuid="GPU-aaa", gpu_util=90.0, gpm=replace(IDLE_GPM, sm_util=45.0, graphics_util=90.0)
    )
    idle = FakeGpu(index=1, uuid="GPU-bbb")
    idle.mig = [
        FakeGpu(
            index=1,
            uuid="MIG-ccc",
            name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            parent_uuid="GPU-bbb",
            gpu_instance_id=2,
            mig_profile="1g.10gb",
        )
    ]
    backend = FakeBackend([busy, idle])
    backend.fail("GPU-bbb", Probe.MEMORY_TEMPERATURE)
    static = parse_static("ml/train-0/worker=GPU-aaa,ml/train-0/sidecar=GPU-aaa,web/infer=MIG-ccc")
    _, url = serve(backend, Attributor(backend, static=static))
    wait_until(lambda: "DCGM_FI_PROF_SM_ACTIVE" in http.get(f"{url}/metrics").text)  # GPM's second sample
    return backend, url


def test_metrics_parse_with_dcgm_names_and_labels(
    two_gpus_with_pods: tuple[FakeBackend, str], http: httpx.Client
) -> None:
    _, url = two_gpus_with_pods
    r = http.get(f"{url}/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in [f.metric for f in FIELDS] + [XID_METRIC]:
        assert name in families, name
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert all(set(s.labels) >= DCGM_LABELS for s in util)
    busy = [s for s in util if s.labels["UUID"] == "GPU-aaa"]
    assert sorted((s.labels["namespace"], s.labels["pod"], s.labels["container"]) for s in busy) == [
        ("ml", "train-0", "sidecar"),
        ("ml", "train-0", "worker"),
    ]  # one series per container, as dcgm-exporter
    assert {s.value for s in busy} == {90.0}
    (s0,) = {s.labels["device"]: s for s in busy if s.labels["container"] == "worker"}.values()
    assert (s0.labels["gpu"], s0.labels["device"], s0.labels["hostname"]) == ("0", "nvidia0", "node-a")
    assert s0.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert s0.labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    idle = [s for s in util if s.labels["UUID"] == "GPU-bbb"]
    assert [(s.labels["pod"], s.labels["namespace"]) for s in idle] == [("", "")]
    sm = {
        s.labels["UUID"] + s.labels.get("GPU_I_ID", ""): s for s in families["DCGM_FI_PROF_SM_ACTIVE"].samples
    }
    assert sm["GPU-aaa"].value == pytest.approx(0.45)  # ratio, not percent
    mig = sm["GPU-bbb2"]  # MIG: parent UUID plus GPU_I_ID, as dcgm-exporter
    assert (mig.labels["GPU_I_PROFILE"], mig.labels["pod"]) == ("1g.10gb", "infer")
    assert mig.labels["modelName"] == "NVIDIA H100 80GB HBM3"  # NVML's "... MIG 1g.10gb" suffix dropped
    assert "GPU_I_ID" not in sm["GPU-aaa"].labels
    temps = {s.labels["UUID"] for s in families["DCGM_FI_DEV_MEMORY_TEMP"].samples}
    assert temps == {"GPU-aaa"}  # unsupported: absent, never 0
    unsupported = families["gpu_efficiency_agent_field_unsupported"].samples
    assert [(s.labels["UUID"], s.labels["field"], s.labels["error"]) for s in unsupported] == [
        ("GPU-bbb", "memory_temp_c", "NVML_ERROR_NOT_SUPPORTED")
    ]
    for name in (
        "gpu_efficiency_agent_samples",
        "gpu_efficiency_agent_nvml_ready",
        "gpu_efficiency_agent_gpus",
    ):
        assert name in families


def test_snapshot_schema(two_gpus_with_pods: tuple[FakeBackend, str], http: httpx.Client) -> None:
    _, url = two_gpus_with_pods
    snap = http.get(f"{url}/snapshot?stats=activity=60,fault=5&history=60").json()
    assert snap["schema"] == SCHEMA
    header = {"node", "hostname", "timestamp", "interval_seconds", "history_seconds", "ready", "reason"}
    assert header | {"backend", "driver_version", "attribution", "gpus", "events"} <= set(snap)
    assert (snap["node"], snap["backend"], snap["ready"]) == ("node-a", "fake", True)
    assert snap["attribution"] == {"source": "static", "error": ""}
    by_uuid = {g["uuid"]: g for g in snap["gpus"]}
    assert set(by_uuid) == {"GPU-aaa", "GPU-bbb", "MIG-ccc"}
    gpu = by_uuid["GPU-bbb"]
    assert set(gpu["fields"]) == {f.key for f in FIELDS}  # every field, null when absent
    assert gpu["fields"]["memory_temp_c"] is None
    assert gpu["unsupported"] == {"memory_temp_c": "NVML_ERROR_NOT_SUPPORTED"}
    assert gpu["faults"]["last_xid"] == 0
    assert gpu["mig"] is None
    assert set(gpu["history"]["signals"]) == set(HISTORY_SIGNALS)
    n = len(gpu["history"]["timestamps"])
    assert n >= 2
    assert all(len(col) == n for col in gpu["history"]["signals"].values())
    assert gpu["timestamp"] == gpu["history"]["timestamps"][-1]
    stats = by_uuid["GPU-aaa"]["stats"]
    assert set(stats) == {"activity", "fault"}
    util = stats["activity"]["DCGM_FI_DEV_GPU_UTIL"]
    assert set(util) == {
        "avg",
        "max",
        "min",
        "last",
        "count",
        "last_timestamp",
        "stddev",
        "changes",
        "resets",
        "first",
    }
    assert (util["max"], util["min"], util["count"] >= 2) == (90.0, 90.0, True)
    mig = by_uuid["MIG-ccc"]
    assert mig["mig"] == {
        "parent_uuid": "GPU-bbb",
        "gpu_instance_id": 2,
        "compute_instance_id": 0,
        "profile": "1g.10gb",
    }
    assert set(mig["fields"]) == {"fb_used_mib", "fb_free_mib", "fb_total_mib"} | {
        f.key for f in FIELDS if f.probe is Probe.GPM
    }
    assert mig["pods"] == [
        {"namespace": "web", "name": "infer", "container": "", "uid": "", "container_id": ""}
    ]


def test_snapshot_history_and_stats_are_opt_in(
    two_gpus_with_pods: tuple[FakeBackend, str], http: httpx.Client, wait_until: Callable[..., Any]
) -> None:
    _, url = two_gpus_with_pods
    for query in ("", "?history=0"):  # raw history only when asked for: a plain GET returns none
        gpu = http.get(f"{url}/snapshot{query}").json()["gpus"][0]
        assert "history" not in gpu
        assert "stats" not in gpu

    def kept() -> list[float]:
        return list(http.get(f"{url}/snapshot?history=inf").json()["gpus"][0]["history"]["timestamps"])

    # Samples every 0.05 s: wait for 1.5 s of them, then ask for the last 0.5 s only. (A window of
    # one or two intervals flaked on a loaded machine, where a sample can come late.)
    wait_until(lambda: (t := kept()) and t[-1] - t[0] >= 1.5, timeout=10.0)
    doc = http.get(f"{url}/snapshot?history=0.5").json()
    recent = doc["gpus"][0]["history"]["timestamps"]
    assert recent, "no sample in the last 0.5 s"
    assert all(doc["timestamp"] - 0.5 <= t <= doc["timestamp"] for t in recent)
    assert kept()[0] < doc["timestamp"] - 1.0  # older samples are kept, just not returned


@pytest.mark.parametrize("query", ["history=-1", "stats=activity=0", "history=abc"])
def test_bad_snapshot_query_is_400(
    two_gpus_with_pods: tuple[FakeBackend, str], http: httpx.Client, query: str
) -> None:
    _, url = two_gpus_with_pods
    assert http.get(f"{url}/snapshot?{query}").status_code == 400


def test_probes_and_unknown_path(two_gpus_with_pods: tuple[FakeBackend, str], http: httpx.Client) -> None:
    _, url = two_gpus_with_pods
    assert http.get(f"{url}/healthz").text == "ok\n"
    ready = http.get(f"{url}/readyz")
    assert ready.status_code == 200
    assert ready.text.startswith("ok: 3 devices")
    assert http.get(f"{url}/nope").status_code == 404
