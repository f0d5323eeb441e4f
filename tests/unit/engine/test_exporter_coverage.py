"""What the exporters serve, in the policy (issue 30): generations, blind spots (SignalsComplete, one
event per change), GPUs tied to no node, GPU_UTIL of an unknowable unit, XIDs counted exactly."""

from __future__ import annotations

from dataclasses import replace

from gpu_efficiency.api import names
from gpu_efficiency.engine.conditions import find_condition
from gpu_efficiency.engine.exporter_coverage import NO_NODE_LABELS, csv_lines
from gpu_efficiency.engine.model import GPUSample, PolicyEvent, Signal, TaintNode, Verdict
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.quarantine.data import data_rules
from gpu_efficiency.engine.quarantine.ecc import judge_ecc
from gpu_efficiency.engine.quarantine.kinds import GpuState
from tests.unit.engine import builders as b
from tests.unit.engine.quarantine.support import Cluster, gpu, node, of_type, policy, st

DEFAULT_CSV_BLIND = frozenset({"ecc", "pcie", "profiling", "occupancy", "tensor", "dram", "pcie-throughput"})


def served(sample: GPUSample, generation: str, blind: frozenset[str] = frozenset()) -> GPUSample:
    return replace(sample, exporter=generation, blind=blind)


def policy_events(plan: object, reason: str) -> list[PolicyEvent]:
    return [a for a in plan.actions if isinstance(a, PolicyEvent) and a.reason == reason]  # type: ignore[attr-defined]


def test_blind_spots_make_signals_complete_false_naming_kinds_and_counts_with_one_event_per_change() -> None:
    gpus = [
        served(b.gpu("GPU-0", b.compute_bound(), ("team-a", "p0")), "default-csv", DEFAULT_CSV_BLIND),
        served(b.gpu("GPU-1", b.compute_bound(), ("team-a", "p1")), "4.9+"),
        served(b.gpu("GPU-2", b.compute_bound(), ("team-a", "p2")), "default-csv", DEFAULT_CSV_BLIND),
    ]
    pods = [b.pod("p0"), b.pod("p1"), b.pod("p2")]
    first = plan_cycle(b.snapshot(gpus, pods))
    cond = find_condition(first.status.conditions, names.COND_SIGNALS)
    assert cond is not None
    assert cond.status == "False"
    assert cond.reason == "Blind:ecc:2,pcie:2,profiling:2,occupancy:2,tensor:2,dram:2,pcie_throughput:2"
    assert "ecc 2 GPUs" in cond.message
    assert first.status.exporter_generations == {"4.9+": 1, "default-csv": 2}
    assert first.status.blind_gpus["ecc"] == 2
    assert len(policy_events(first, names.EV_SIGNALS_INCOMPLETE)) == 1
    # the same blind kinds next cycle: no new event, even with another GPU count
    again = plan_cycle(b.snapshot(gpus[:2], pods, status=first.status))
    assert policy_events(again, names.EV_SIGNALS_INCOMPLETE) == []
    assert find_condition(again.status.conditions, names.COND_SIGNALS).reason.startswith("Blind:ecc:1,")  # type: ignore[union-attr]
    # every GPU fully served: True, and one Normal event
    fixed = [served(g, "4.9+") for g in gpus]
    healed = plan_cycle(b.snapshot(fixed, pods, status=again.status))
    assert find_condition(healed.status.conditions, names.COND_SIGNALS).status == "True"  # type: ignore[union-attr]
    assert len(policy_events(healed, names.EV_SIGNALS_COMPLETE)) == 1
    assert healed.status.blind_gpus == {}


def test_the_csv_lines_to_add_name_the_missing_fields() -> None:
    lines = csv_lines({"ecc": 2, "profiling": 2, "pcie": 1})
    assert any(line.startswith("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter,") for line in lines)
    assert any(line.startswith("DCGM_FI_PROF_SM_ACTIVE, gauge,") for line in lines)
    assert any(line.startswith("DCGM_FI_DEV_PCIE_LINK_WIDTH, gauge,") for line in lines)


def test_a_default_csv_gpu_without_ecc_counters_is_never_ecc_healthy() -> None:
    sample = served(gpu("n1", fault={Signal.ECC_DBE_VOLATILE: None}), "default-csv", DEFAULT_CSV_BLIND)
    judged = judge_ecc(sample, data_rules(cycle_params(policy()), b.NOW))
    assert judged.state is GpuState.UNKNOWN
    assert judged.state is not GpuState.HEALTHY


def test_no_gpu_tied_to_a_node_says_so_naming_the_labels_found() -> None:
    nodeless = replace(
        b.gpu("GPU-0", b.idle(), ("team-a", "p")), node="", labels_seen=frozenset({"UUID", "gpu", "instance"})
    )
    plan = plan_cycle(b.snapshot([nodeless], [b.pod("p")]))
    cond = find_condition(plan.status.conditions, names.COND_METRICS)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", NO_NODE_LABELS)
    assert "labels found: UUID, gpu, instance" in cond.message
    assert "hostname, Hostname, kubernetes_node, node, nodename" in cond.message
    assert len(policy_events(plan, names.EV_METRICS_UNAVAILABLE)) == 1
    assert all(v.verdict is Verdict.UNKNOWN for v in plan.verdicts)


def test_a_busy_gpu_served_in_ratio_units_is_never_reclaimed() -> None:
    """The source hands the engine GPU_UTIL in percent whatever the exporter: a 0-1 ratio of 0.9 is
    90 (sources/metrics/prometheus/promql.py ``over``). Read as percent it would have been 0.9 %, below a 1 % idle
    threshold: the GPU_UTIL fallback (no profiling fields) would have judged it idle."""
    spec = b.enforce(idle={"activity_below": 0.01})
    ratio_read_as_ratio = {Signal.GPU_UTIL: b.stats(90.0, 100.0, stddev=5.0)}
    plan = plan_cycle(b.snapshot([b.gpu("GPU-0", ratio_read_as_ratio, ("team-a", "p"))], [b.pod("p")], spec))
    (verdict,) = plan.verdicts
    assert verdict.verdict is not Verdict.IDLE
    assert not [a for a in plan.actions if type(a).__name__ in ("EvictPod", "ReclaimOwner")]
    # the same series read as percent (the bug this guards against) would have been idle
    misread = {Signal.GPU_UTIL: b.stats(0.9, 0.95, stddev=0.05)}  # 0.9 and 0.95, as percent
    wrong = plan_cycle(b.snapshot([b.gpu("GPU-0", misread, ("team-a", "p"))], [b.pod("p")], spec))
    assert wrong.verdicts[0].verdict is Verdict.IDLE


def test_gpu_util_of_an_unknowable_unit_never_drives_an_idle_verdict() -> None:
    """A DCGM_FI_DEV_GPU_UTIL_RATIO series holding 0-100 (DCGM 4.6 still fills field 203 with NVML's
    percent) reaches the engine x100: out of range, so Unknown, never idle."""
    percent_under_ratio_name = {Signal.GPU_UTIL: b.stats(9000.0, 10000.0)}
    plan = plan_cycle(b.snapshot([b.gpu("GPU-0", percent_under_ratio_name, ("team-a", "p"))], [b.pod("p")]))
    assert plan.verdicts[0].verdict is Verdict.UNKNOWN


# ---- XIDs counted (DCGM_EXP_XID_ERRORS_COUNT) ---------------------------------------------------------


def steady_79() -> dict[Signal, object]:
    return {Signal.XID: st(79)}  # the gauge held 79 the whole lookback: no change to see


def test_a_repeated_xid_the_gauge_cannot_see_is_counted_where_the_exporter_counts() -> None:
    spec = policy(xid={"repeat": [{"codes": [79], "count": 2, "within": "1h"}]})
    gauge_only = Cluster.of(node("n1"), spec=spec)
    assert of_type(gauge_only.cycle([gpu("n1", fault=steady_79())]).actions, TaintNode) == []
    counted = Cluster.of(node("n1"), spec=spec)
    twice = replace(gpu("n1", fault=steady_79()), xid_events={120: {79: 2}, 3600: {79: 2}})
    outcome = counted.cycle([twice])
    assert of_type(outcome.actions, TaintNode) == [TaintNode(node="n1", kind="xid", effect="NoSchedule")]


def test_a_counted_xid_below_its_repeat_count_is_pending_and_other_codes_are_healthy() -> None:
    spec = policy(xid={"repeat": [{"codes": [79], "count": 3, "within": "1h"}]})
    once = replace(gpu("n1", fault=steady_79()), xid_events={120: {79: 1, 13: 4}, 3600: {79: 2, 13: 4}})
    outcome = Cluster.of(node("n1"), spec=spec).cycle([once])
    assert of_type(outcome.actions, TaintNode) == []
    none = replace(gpu("n1", fault=steady_79()), xid_events={120: {}, 3600: {}})
    assert of_type(Cluster.of(node("n1")).cycle([none]).actions, TaintNode) == []
