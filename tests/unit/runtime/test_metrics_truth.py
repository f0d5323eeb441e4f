"""What the README and docs/, the Grafana dashboard and the chart's alert rules name is what the code exports
and writes: every metric has samples after a cycle, every documented annotation, condition and
event reason exists in code, and every one in code is documented. Per-cycle gauges follow the
last cycle, a deleted policy's series go, and a standby replica exports no policy gauges."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.engine import builders as b
from tests.unit.runtime.test_scheduler import body
from tests.unit.user_docs import USER_DOCS, user_docs_text

from gpu_efficiency import metrics
from gpu_efficiency.actuators.notify.delivery import Notifier
from gpu_efficiency.api import names
from gpu_efficiency.api.exporter_fields import NODE_LABELS
from gpu_efficiency.api.policy import KIND, Mode
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine import DropReason
from gpu_efficiency.engine.exporter_coverage import NO_NODE_LABELS
from gpu_efficiency.engine.model import Verdict
from gpu_efficiency.engine.quarantine.kinds import REASON_CLEARED, REASON_DEGRADED_CLEARED, FaultKind
from gpu_efficiency.engine.reclaim.annotations import STATE_WARNED
from gpu_efficiency.runtime.fault_wake import AGENT_FAULT_REASONS
from gpu_efficiency.runtime.scheduler import PolicyRegistry, Scheduler

from .cycle_harness import ENFORCE_SPEC, SwitchLeader, run_cycle, runner, warned_idle_pod

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gpu-efficiency-operator"
DOCUMENTS = (
    *USER_DOCS,
    CHART / "files" / "dashboard.json",
    CHART / "templates" / "prometheusrule.yaml",
)
METRIC = re.compile(r"\bgpu_efficiency_[a-z_]+[a-z]")


PER_POLICY = (
    metrics.CYCLES, metrics.CYCLE_SECONDS, metrics.PODS, metrics.DIAGNOSES, metrics.IDLE_GPUS,
    metrics.EVICTIONS, metrics.IDLE_GPU_HOURS, metrics.WASTE_PER_HOUR, metrics.METRICS_AVAILABLE,
    metrics.BREAKER_OPEN, metrics.TAINTED_NODES, metrics.PROM_QUERIES, metrics.API_WRITES,
    metrics.STRAGGLER_GPUS,
    metrics.POD_EVICTION_PENDING, metrics.NOTIFICATIONS,
)  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    """Each test starts with no policy series and no leader (the registry is process-wide)."""
    for metric in PER_POLICY:
        metric.clear()
    metrics.LEADER.set(0)
    yield
    for metric in PER_POLICY:
        metric.clear()


def documented_metrics() -> dict[str, set[str]]:
    """Metric names each document uses, as Prometheus sees them (counters with _total)."""
    return {doc.name: set(METRIC.findall(doc.read_text())) for doc in DOCUMENTS}


def exported() -> tuple[set[str], set[str]]:
    """(names of samples, names of families with samples) in the operator's registry."""
    samples, families = set(), set()
    for family in metrics.REGISTRY.collect():
        if family.samples:
            families.add(family.name)
            samples.update(s.name for s in family.samples)
    return samples, families


def sample(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def mixed_cycle(tmp_dir: Path) -> None:
    """One cycle seeing an idle pod past its warning (eviction blocked), a compute-bound one and a
    data-starved one, run by the scheduler as the leader would."""
    gpus = [
        b.gpu("GPU-0", b.idle(), ("team-a", "idle")),
        b.gpu("GPU-1", b.compute_bound(), ("team-a", "busy")),
        b.gpu("GPU-2", b.input_starved(), ("team-a", "starved")),
        b.gpu("GPU-3", b.idle(), ("team-a", "pending")),
    ]
    pending = b.pod(
        "pending",
        annotations={
            names.STATE: "Warned",
            names.IDLE_SINCE: format_rfc3339(b.NOW - 3600),
            names.EVICT_AFTER: format_rfc3339(b.NOW + 120),
        },
    )
    pods = [warned_idle_pod("idle", b.NOW), b.pod("busy"), b.pod("starved"), pending]
    for i in range(4):  # a judged job group (gpu_efficiency_straggler_gpus)
        gpus.append(b.gpu(f"GPU-{i + 3}", b.compute_bound(), ("team-a", f"train-{i}")))
        pods.append(b.pod(f"train-{i}", labels={"batch.kubernetes.io/job-name": "train"}))
    cycle_runner = runner(gpus, pods)
    cycle_runner.notifier = Notifier(tmp_dir)  # no Secret mounted: each post fails at once, counted
    registry = PolicyRegistry()
    sink = {"name": "team", "type": "CloudEvents", "urlSecretKey": "url"}
    spec = {**ENFORCE_SPEC, "stragglers": {"enabled": True}, "notify": [sink]}
    registry.observe("ADDED", body("truth", "2026-01-01T00:00:00Z", spec=spec))
    assert Scheduler(cycle_runner, registry).run_due() == ["truth"]
    cycle_runner.notifier.stop()


def test_every_metric_the_docs_dashboard_and_alerts_name_is_exported_with_samples(tmp_path: Path) -> None:
    mixed_cycle(tmp_path)
    samples, families = exported()
    cache_metrics = {
        m for names_ in documented_metrics().values() for m in names_ if m.startswith("gpu_efficiency_cache_")
    }
    registered = {
        name for family in metrics.REGISTRY.collect() for name in (family.name, f"{family.name}_total")
    }
    missing = {
        doc: sorted(
            m
            for m in found
            if m not in samples and m not in families and not (m in cache_metrics and m in registered)
        )
        for doc, found in documented_metrics().items()
    }
    # The watch cache's metrics come from its informer threads (tests/unit/sources/kube/test_watch_cache.py
    # checks their values); a cycle without a cluster only proves they are registered.
    assert missing == {doc: [] for doc in missing}
    assert sample("gpu_efficiency_leader") == 1.0
    assert sample("gpu_efficiency_evictions_total", policy="truth", result="blocked") == 1.0
    assert (
        sample("gpu_efficiency_straggler_gpus", policy="truth", namespace="team-a", group="job/train") == 0.0
    )
    deadline = format_rfc3339(b.NOW + 120)
    labels = {"policy": "truth", "namespace": "team-a", "pod": "pending", "owner": "", "deadline": deadline}
    assert sample("gpu_efficiency_pod_eviction_pending", **labels) == b.NOW + 120


def test_idle_gpu_hours_count_idle_gpus_times_the_time_since_the_last_cycle() -> None:
    gpus = [b.gpu("GPU-0", b.idle(), ("team-a", "a")), b.gpu("GPU-1", b.idle(), ("team-a", "c"))]
    cycle_runner = runner(gpus, [b.pod("a"), b.pod("c")])
    run_cycle(cycle_runner, spec={"interval": "60s"})
    # The first cycle counts one interval for each of the two idle GPUs.
    assert sample("gpu_efficiency_idle_gpu_hours_total", policy="truth") == pytest.approx(2 * 60 / 3600)
    status = cycle_runner.status_writer.written["truth"]  # type: ignore[attr-defined]
    assert status.idle_gpu_hours == pytest.approx(2 * 60 / 3600)


def test_every_drop_reason_is_exported_at_zero_from_the_first_cycle() -> None:
    """An alert on ``rate(gpu_efficiency_dropped_samples_total{reason=...}[5m])`` sees the first
    forged sample of any kind: every reason the engine can drop for has its series before that."""
    run_cycle(runner([b.gpu("GPU-0", b.compute_bound(), ("team-a", "p"))], [b.pod("p")]), spec={})
    for reason in DropReason:
        assert sample("gpu_efficiency_dropped_samples_total", policy="truth", reason=reason.value) == 0.0, (
            reason
        )


def test_a_gone_diagnosis_is_no_longer_exported() -> None:
    starved = [b.gpu("GPU-0", b.input_starved(), ("team-a", "p"))]
    run_cycle(runner(starved, [b.pod("p")]), spec={})
    diagnoses = {
        s.labels["diagnosis"]
        for family in metrics.DIAGNOSES.collect()
        for s in family.samples
        if s.labels["policy"] == "truth"
    }
    assert diagnoses == {"input-starved"}
    busy = [b.gpu("GPU-0", b.compute_bound(), ("team-a", "p"))]
    run_cycle(runner(busy, [b.pod("p")]), spec={})
    assert sample("gpu_efficiency_diagnoses", policy="truth", diagnosis="input-starved") is None
    assert sample("gpu_efficiency_diagnoses", policy="truth", diagnosis="compute-bound") == 1.0


def test_a_deleted_policy_leaves_no_series() -> None:
    cycle_runner = runner([b.gpu("GPU-0", b.idle(), ("team-a", "p"))], [b.pod("p")])
    registry = PolicyRegistry()
    scheduler = Scheduler(cycle_runner, registry)
    policy = {
        "metadata": {
            "name": "gone",
            "uid": "u",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "generation": 1,
        },
        "spec": {},
    }
    registry.observe("ADDED", policy)
    assert scheduler.run_due() == ["gone"]
    assert sample("gpu_efficiency_metrics_available", policy="gone") == 1.0
    registry.observe("DELETED", policy)
    scheduler.run_due()
    left = [
        s for metric in PER_POLICY for f in metric.collect() for s in f.samples
        if s.labels.get("policy") == "gone"
    ]  # fmt: skip
    assert left == []


def test_a_replica_that_loses_the_lease_drops_its_policy_gauges() -> None:
    leader = SwitchLeader(leading=True)
    cycle_runner = runner([b.gpu("GPU-0", b.idle(), ("team-a", "p"))], [b.pod("p")], leader=leader)
    scheduler = Scheduler(cycle_runner, PolicyRegistry())
    scheduler.export_leadership()
    run_cycle(cycle_runner)
    assert sample("gpu_efficiency_metrics_available", policy="truth") == 1.0
    assert sample("gpu_efficiency_leader") == 1.0
    leader.leading = False
    scheduler.export_leadership()
    assert sample("gpu_efficiency_leader") == 0.0
    assert sample("gpu_efficiency_metrics_available", policy="truth") is None
    assert sample("gpu_efficiency_pods", policy="truth", verdict="Idle") is None
    assert sample("gpu_efficiency_cycles_total", policy="truth", result="ok") == 1.0  # counters stay


def test_an_invalid_policy_exports_no_stale_gauges() -> None:
    cycle_runner = runner([b.gpu("GPU-0", b.idle(), ("team-a", "p"))], [b.pod("p")])
    run_cycle(cycle_runner)
    assert sample("gpu_efficiency_metrics_available", policy="truth") == 1.0
    run_cycle(cycle_runner, spec={"mode": "Destroy"}, generation=2)
    assert sample("gpu_efficiency_metrics_available", policy="truth") is None
    assert sample("gpu_efficiency_cycles_total", policy="truth", result="invalid") == 1.0


# ---- names users read: annotations, conditions, event reasons -------------------------------------

ANNOTATION = re.compile(r"(?<![\w.])(?:gpuefficiency\.io|…)/([a-z][a-z-]*[a-z])")
BACKTICKED = re.compile(r"`([A-Z][A-Za-z]+)`")
#: Kubernetes' own words the docs quote (an image pull policy, DRA device taints), not names of ours.
KUBERNETES_WORDS = frozenset(
    {"IfNotPresent", "DeviceTaintRule", "DRADeviceTaintRules", "NoSchedule", "NoExecute"}
)


def _values(prefix: str) -> set[str]:
    return {
        getattr(names, n) for n in dir(names) if n.startswith(prefix) and isinstance(getattr(names, n), str)
    }


def code_annotations() -> set[str]:
    return {
        a.removeprefix("gpuefficiency.io/")
        for a in (*names.OPERATOR_POD_ANNOTATIONS, names.EXEMPT, *names.ACKNOWLEDGEMENTS, names.NOTIFY_CHANNEL,
                  names.SLACK_URL_SECRET_KEY, names.NODE_FAULTS,
                  names.FAULT_RECOVERED, names.FAULT_TAINT_KEY, names.XID_HISTORY, names.POD_GPU_FAULT,
                  *names.OWNER_ANNOTATIONS)
    }  # fmt: skip


def test_documented_annotations_exist_in_code_and_the_reverse() -> None:
    documented = set(ANNOTATION.findall(user_docs_text()))
    assert sorted(documented - code_annotations()) == [], "documented but never written or read"
    assert sorted(code_annotations() - documented) == [], "written or read but not documented"


def test_documented_conditions_and_event_reasons_exist_in_code_and_the_reverse() -> None:
    readme = user_docs_text()
    conditions, reasons = _values("COND_"), _values("EV_")
    vocabulary = (
        conditions | reasons | {v.value for v in Verdict} | {m.value for m in Mode}
        | {STATE_WARNED, names.GPU_HEALTHY, names.GPU_DEGRADED, KIND} | KUBERNETES_WORDS
        | {k.condition_reason for k in FaultKind} | {REASON_CLEARED, REASON_DEGRADED_CLEARED}
        | AGENT_FAULT_REASONS | set(NODE_LABELS) | {NO_NODE_LABELS}
    )  # fmt: skip
    documented = set(BACKTICKED.findall(readme))
    assert sorted(documented - vocabulary) == [], "the docs name a condition or reason the code lacks"
    assert sorted((conditions | reasons) - documented) == [], "the code sets names the docs omit"


def test_the_pending_eviction_series_goes_when_the_warning_ends() -> None:
    warned = b.pod(
        "p",
        annotations={
            names.STATE: "Warned",
            names.IDLE_SINCE: format_rfc3339(b.NOW - 3600),
            names.EVICT_AFTER: format_rfc3339(b.NOW + 120),
        },
    )
    labels = {"policy": "truth", "namespace": "team-a", "pod": "p", "owner": ""}
    labels["deadline"] = format_rfc3339(b.NOW + 120)
    run_cycle(runner([b.gpu("GPU-0", b.idle(), ("team-a", "p"))], [warned]))
    assert sample("gpu_efficiency_pod_eviction_pending", **labels) == b.NOW + 120
    run_cycle(runner([b.gpu("GPU-0", b.compute_bound(), ("team-a", "p"))], [warned]))  # working again
    assert sample("gpu_efficiency_pod_eviction_pending", **labels) is None
