"""The /metrics text: parses as Prometheus text format, with dcgm-exporter's names and label variants."""

from __future__ import annotations

import itertools
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.exposition import PodLabels
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.simulator import SimOptions, WorkloadPlay
from tests.unit.sim.helpers import pod, simulator


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_every_metric_parses_with_help_type_and_one_series_per_gpu() -> None:
    sim, _ = simulator(nodes=2, gpus=4)
    text = sim.render(t=5.0)
    assert text.count(f"# TYPE {Signal.ECC_DBE_VOLATILE} counter") == 1
    assert f"# HELP {Signal.SM_ACTIVE} " in text
    parsed = samples(text)
    for metric in catalog.METRIC_NAMES:
        name = metric.removesuffix("_total") if metric in catalog.COUNTERS else metric
        series = parsed.get(name) or parsed.get(name + "_total")
        assert series is not None, metric
        assert len(series) == 8, metric
    labels = parsed[Signal.GPU_UTIL][0][0]
    assert labels["gpu"] == "0"
    assert labels["device"] == "nvidia0"
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["Hostname"] == "node-0"
    assert labels["UUID"].startswith("GPU-")
    assert len(labels["UUID"]) == 40
    assert not {"pod", "namespace"} & set(labels), "free GPUs carry no pod labels"


def test_uuids_are_stable_and_distinct() -> None:
    sim, _ = simulator(nodes=2, gpus=8)
    again, _ = simulator(nodes=2, gpus=8)
    uuids = {sim.uuid_of(f"node-{n}", i) for n in range(2) for i in range(8)}
    assert len(uuids) == 16
    assert sim.uuid_of("node-1", 3) == again.uuid_of("node-1", 3)


def _pod_labels(mode: PodLabels) -> dict[str, str]:
    sim, _ = simulator(options=SimOptions(pod_labels=mode))
    sim.set_pods([pod("trainer-0", "node-0", namespace="team-a")])
    series = samples(sim.render(t=1.0))[Signal.GPU_UTIL]
    return next(labels for labels, _ in series if labels["gpu"] == "0")


def test_standard_pod_labels() -> None:
    labels = _pod_labels(PodLabels.STANDARD)
    assert (labels["pod"], labels["namespace"], labels["container"]) == ("trainer-0", "team-a", "main")


def test_exported_pod_labels_come_with_the_exporters_own_identity() -> None:
    labels = _pod_labels(PodLabels.EXPORTED)
    assert (labels["exported_pod"], labels["exported_namespace"], labels["exported_container"]) == (
        "trainer-0",
        "team-a",
        "main",
    )
    assert labels["pod"].startswith("nvidia-dcgm-exporter")
    assert labels["namespace"] == "gpu-operator"


def test_legacy_and_no_pod_labels() -> None:
    legacy = _pod_labels(PodLabels.LEGACY)
    assert (legacy["pod_name"], legacy["pod_namespace"], legacy["container_name"]) == (
        "trainer-0",
        "team-a",
        "main",
    )
    assert "pod" not in legacy
    bare = _pod_labels(PodLabels.NONE)
    assert not {"pod", "exported_pod", "pod_name", "namespace"} & set(bare)


def test_without_sm_active_only_gr_engine_active_remains_among_prof_fields() -> None:
    sim, _ = simulator(options=SimOptions(sm_active=False))
    names = set(samples(sim.render(t=1.0)))
    assert Signal.GR_ENGINE_ACTIVE in names
    assert Signal.GPU_UTIL in names
    assert not {str(m) for m in catalog.OFF_WITHOUT_SM_ACTIVE} & names
    assert Signal.SM_ACTIVE not in names


def test_old_clock_events_name() -> None:
    sim, _ = simulator(options=SimOptions(clock_events_metric=catalog.CLOCK_EVENTS_OLD))
    names = set(samples(sim.render(t=1.0)))
    assert catalog.CLOCK_EVENTS_OLD in names
    assert catalog.CLOCK_EVENTS_NEW not in names


def test_attributed_gpus_play_their_workload_and_free_ones_idle() -> None:
    play = WorkloadPlay("ns", "train", profile="compute-bound")
    sim, _ = simulator(gpus=2, workloads=(play,))
    sim.set_pods([pod("train-1", "node-0", workload="train")])
    util = {labels["gpu"]: v for labels, v in samples(sim.render(t=3.0))[Signal.SM_ACTIVE]}
    assert util["0"] > 0.8
    assert util["1"] == 0.0


def test_unknown_pods_follow_their_profile_annotation_else_the_default() -> None:
    sim, _ = simulator(gpus=2, options=SimOptions(default_profile="fake-load"))
    sim.set_pods(
        [
            pod(
                "a",
                "node-0",
                created="2026-01-01T00:00:01Z",
                annotations={"sim.gpuefficiency.io/profile": "idle"},
            ),
            pod("b", "node-0", created="2026-01-01T00:00:02Z"),
        ]
    )
    util = {labels["pod"]: v for labels, v in samples(sim.render(t=3.0))[Signal.GPU_UTIL]}
    assert util == {"a": 0.0, "b": pytest.approx(100.0, abs=1.0)}


def test_a_pods_own_profile_annotation_overrides_its_workloads_profile() -> None:
    """One replica busy while the others idle, and a profile switched mid-run by annotating the pod."""
    play = WorkloadPlay("ns", "train", profile="idle")
    sim, _ = simulator(gpus=3, workloads=(play,))
    busy = {"sim.gpuefficiency.io/profile": "compute-bound"}
    sim.set_pods(
        [
            pod("train-a", "node-0", workload="train", created="2026-01-01T00:00:01Z"),
            pod("train-b", "node-0", workload="train", created="2026-01-01T00:00:02Z", annotations=busy),
            pod("train-c", "node-0", workload="train", created="2026-01-01T00:00:03Z"),
        ]
    )
    sm = {labels["pod"]: v for labels, v in samples(sim.render(t=3.0))[Signal.SM_ACTIVE]}
    assert sm["train-a"] == 0.0
    assert sm["train-b"] > 0.8
    assert sm["train-c"] == 0.0


def test_deleted_pods_release_their_gpus() -> None:
    sim, _ = simulator(gpus=1)
    sim.set_pods([pod("a", "node-0")])
    assert samples(sim.render(t=1.0))[Signal.GPU_UTIL][0][0].get("pod") == "a"
    sim.set_pods([])
    assert "pod" not in samples(sim.render(t=2.0))[Signal.GPU_UTIL][0][0]


def test_profile_changes_and_timeline_overrides_play_at_their_times() -> None:
    play = WorkloadPlay(
        "ns",
        "w",
        profile="idle",
        changes=((90.0, "compute-bound"),),
        timeline=((10.0, {Signal.GPU_TEMP: 99.0}), (20.0, {Signal.GPU_TEMP: None, Signal.XID: 31.0})),
    )
    sim, _ = simulator(gpus=1, workloads=(play,))
    sim.set_pods([pod("w-0", "node-0", workload="w")])
    assert sim.gpu_values("node-0", 0, 89.0)[Signal.SM_ACTIVE] == 0.0  # type: ignore[index]
    assert sim.gpu_values("node-0", 0, 91.0)[Signal.SM_ACTIVE] > 0.8  # type: ignore[index]
    assert sim.gpu_values("node-0", 0, 15.0)[Signal.GPU_TEMP] == 99.0  # type: ignore[index]
    after = sim.gpu_values("node-0", 0, 25.0)
    assert after is not None
    assert after[Signal.GPU_TEMP] < 50
    assert after[Signal.XID] == 31.0


def test_nan_from_garbage_is_spelt_as_the_text_format_wants() -> None:
    fault = Fault(FaultKind.GARBAGE, at=0.0, value="nan", metric=str(Signal.SM_ACTIVE))
    sim, _ = simulator(gpus=1, faults=(fault,))
    text = sim.render(t=1.0)
    assert 'DCGM_FI_PROF_SM_ACTIVE{gpu="0"' in text
    assert "} NaN\n" in text
    value = samples(text)[Signal.SM_ACTIVE][0][1]
    assert math.isnan(value)


def test_energy_counter_integrates_power_and_never_decreases() -> None:
    sim, _ = simulator(gpus=1)
    readings = [sim.gpu_values("node-0", 0, float(t)) for t in range(10)]
    energy = [r[catalog.ENERGY] for r in readings if r is not None]
    assert all(b > a for a, b in itertools.pairwise(energy))
    assert 60_000 < energy[1] - energy[0] < 80_000  # ~70 W for 1 s, in mJ
