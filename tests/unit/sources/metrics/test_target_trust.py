"""Safety rule 9 at the Prometheus source: a GPU's identity and its faults count only from a
scrape target on the GPU's own node (``sources/metrics/targets.py``).

A fake Prometheus answers the cycle's queries from series it holds per scrape target (its
``instance``), as the real one keeps every target's series apart; the cluster's address book says
which node each target runs on. The samples then go through the fault engine, as in a cycle.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import httpx
from tests.unit.engine.quarantine.support import node, snapshot
from tests.unit.sources.metrics.fake_http import form, json_answer

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.engine.model import DrainPod, NodeView, Signal, TaintDevices, TaintNode, Window
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults
from gpu_efficiency.engine.reads import windows_for
from gpu_efficiency.engine.trust import DropReason
from gpu_efficiency.sources.metrics.base import FaultHints, FetchRequest, FetchResult
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.promql import AGG_LABEL, CANDIDATE_LABEL
from gpu_efficiency.sources.metrics.targets import (
    PodAddress,
    address_book,
    target_host,
)

NOW = 1_700_000_000.0
SPEC = GPUEfficiencyPolicySpec.model_validate(
    {"mode": "Enforce", "faults": {"xid": {"effect": "NoExecute"}, "drainTimeout": "0s"}}
)
WINDOWS = windows_for(SPEC)
SCRAPE = 15.0
EXPORTER_N1, EXPORTER_N2, TENANT_N2 = "10.244.1.7:9400", "10.244.2.9:9400", "10.244.2.50:8080"
PODS = (
    PodAddress("u1", ("10.244.1.7",), "n1"),  # dcgm-exporter's DaemonSet pod on n1
    PodAddress("u2", ("10.244.2.9",), "n2"),  # and on n2
    PodAddress("u3", ("10.244.2.50",), "n2"),  # a tenant's pod on n2, scraped by its ServiceMonitor
)
NODES = (
    node("n1", gpus=2),
    node("n2", gpus=2),
    node("n3", gpus=2),  # no exporter: its GPUs are not exported
)


@dataclass
class Gpu:
    uuid: str
    hostname: str
    xid: float = 0.0  # the XID gauge now; it rose from 0 within the window when not 0


@dataclass
class FakePrometheus:
    """Series per scrape target (``instance``): what each target exports."""

    targets: dict[str, list[Gpu]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        query = form(request)["query"][0]
        self.queries.append(query)
        return json_answer(
            json.dumps(
                {
                    "status": "success",
                    "data": {
                        "resultType": "vector",
                        "result": [
                            {"metric": labels, "value": [NOW, str(value)]}
                            for labels, value in self.answer(query)
                        ],
                    },
                }
            ).encode()
        )

    def answer(self, query: str) -> list[tuple[dict[str, str], float]]:
        every = [(instance, g) for instance, gpus in self.targets.items() for g in gpus]
        if query.startswith("group by (UUID"):  # identity: one series per GPU and target
            return [
                ({"UUID": g.uuid, "gpu": "0", "Hostname": g.hostname, "instance": i}, 1) for i, g in every
            ]
        if CANDIDATE_LABEL in query:  # the fault filter names GPUs with a non-zero fault signal
            return [({"UUID": g.uuid, CANDIDATE_LABEL: Window.FAULT.value}, 1) for _, g in every if g.xid]
        if AGG_LABEL not in query or "XID:" not in query:
            return []  # the activity window: not needed here
        listed = re.search(r'UUID=~"([^"]*)"', query)
        wanted = set(listed.group(1).split("|")) if listed else {g.uuid for _, g in every}
        per_target = "instance)" in query  # max by (UUID, GPU_I_ID, instance)
        out = []
        count = WINDOWS[Window.FAULT] / SCRAPE
        for instance, g in every:
            if g.uuid not in wanted:
                continue
            values = {
                "last": g.xid,
                "max": g.xid,
                "min": 0.0,
                "changes": 1.0 if g.xid else 0.0,
                "count": count,
                "ts": NOW - 5,
            }
            for agg, value in values.items():
                labels = {"UUID": g.uuid, AGG_LABEL: f"XID:{agg}"}
                if per_target:
                    labels["instance"] = instance
                out.append((labels, value))
        return out


def fetch(prometheus: FakePrometheus, *, book: bool = True) -> FetchResult:
    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test", matchers=""),
        transport=httpx.MockTransport(prometheus.handle),
    )
    request = FetchRequest(
        now=NOW,
        windows=WINDOWS,
        scrape_interval=SCRAPE,
        hints=FaultHints(),
        targets=address_book(NODES, PODS) if book else None,
    )
    return source.fetch(request)


def quarantines(result: FetchResult, nodes: tuple[NodeView, ...] = NODES) -> list[object]:
    outcome = evaluate_faults(snapshot(nodes, result.gpus, spec=SPEC, now=NOW))
    return [a for a in outcome.actions if isinstance(a, TaintNode | TaintDevices | DrainPod)]


def real_cluster() -> FakePrometheus:
    return FakePrometheus(
        targets={
            EXPORTER_N1: [Gpu("GPU-n1-0", "n1"), Gpu("GPU-n1-1", "n1")],
            EXPORTER_N2: [Gpu("GPU-n2-0", "n2"), Gpu("GPU-n2-1", "n2")],
        }
    )


def test_a_forged_xid_on_a_real_gpu_from_a_foreign_target_is_dropped_and_counted() -> None:
    prometheus = real_cluster()
    # A tenant's target (its pod on n2) publishes XID 48 with n1's real GPU UUID and node label.
    prometheus.targets[TENANT_N2] = [Gpu("GPU-n1-0", "n1", xid=48)]
    result = fetch(prometheus)
    gpu = next(g for g in result.gpus if g.uuid == "GPU-n1-0")
    assert gpu.node == "n1"
    xid = gpu.get(Window.FAULT, Signal.XID)
    assert xid is not None
    assert xid.last == 0  # the exporter on n1's reading, not the tenant's
    assert quarantines(result) == []  # no taint, no drain
    assert result.dropped.get(DropReason.FAULT_OFF_TARGET) == 1
    assert result.dropped.get(DropReason.IDENTITY_OFF_NODE) == 1  # the tenant's identity series for it


def test_the_same_xid_from_the_gpus_own_exporter_quarantines() -> None:
    prometheus = real_cluster()
    prometheus.targets[EXPORTER_N1][0].xid = 48
    result = fetch(prometheus)
    assert [a.node for a in quarantines(result) if isinstance(a, TaintNode)] == ["n1"]
    assert result.dropped == {}


def test_an_invented_gpu_on_a_node_whose_gpus_are_not_exported_is_dropped() -> None:
    prometheus = real_cluster()
    prometheus.targets[TENANT_N2] = [Gpu("GPU-invented", "n3", xid=79)]
    result = fetch(prometheus)
    assert "GPU-invented" not in {g.uuid for g in result.gpus}
    assert quarantines(result) == []
    assert result.dropped.get(DropReason.IDENTITY_OFF_NODE) == 1


def test_a_target_on_the_node_reports_its_gpus_under_any_address_the_node_has() -> None:
    # A hostNetwork exporter (the node's InternalIP), or instance relabelled to the node's name.
    nodes = (replace_addresses(NODES[0], ("192.168.0.11", "n1.example")), NODES[1], NODES[2])
    for instance in ("192.168.0.11:9400", "n1", "n1.example:9400", "[fd00::11]:9400"):
        book = address_book(nodes, (PodAddress("v6", ("fd00::11",), "n1"),))
        assert book.get(target_host(instance)) == "n1", instance


def replace_addresses(view: NodeView, addresses: tuple[str, ...]) -> NodeView:
    from dataclasses import replace

    return replace(view, addresses=addresses)


def test_an_address_two_nodes_claim_names_neither() -> None:
    book = address_book(NODES, (PodAddress("a", ("10.0.0.5",), "n1"), PodAddress("b", ("10.0.0.5",), "n2")))
    assert "10.0.0.5" not in book
    assert book["n1"] == "n1"


def test_a_tenant_on_another_node_claiming_a_real_gpu_blinds_it_but_never_moves_it() -> None:
    prometheus = real_cluster()
    prometheus.targets[TENANT_N2] = [Gpu("GPU-n1-1", "n2", xid=48)]  # "n1's GPU sits on n2"
    result = fetch(prometheus)
    # Two targets, each on the node it names: which one lies cannot be told from Prometheus
    # alone (the node agent can: merge_samples). Neither is believed: Unknown, never a fault.
    assert "GPU-n1-1" not in {g.uuid for g in result.gpus}
    assert result.dropped.get(DropReason.NODE_CONFLICT) == 1
    assert quarantines(result) == []


def test_query_count_is_the_same_with_forged_targets() -> None:
    clean, forged = real_cluster(), real_cluster()
    for prometheus in (clean, forged):
        prometheus.targets[EXPORTER_N2][0].xid = 79  # a real fault: the fault window is fetched
    forged.targets[TENANT_N2] = [Gpu(f"GPU-fake-{i}", "n1", xid=48) for i in range(50)]
    assert fetch(clean).queries == fetch(forged).queries


def test_without_an_address_book_every_target_counts_as_before() -> None:
    prometheus = real_cluster()
    prometheus.targets[TENANT_N2] = [Gpu("GPU-n1-0", "n1", xid=48)]
    assert [a.node for a in quarantines(fetch(prometheus, book=False)) if isinstance(a, TaintNode)] == ["n1"]


def test_only_live_pods_lend_their_ip_to_a_target() -> None:
    from gpu_efficiency.sources.kube.cluster import pod_address

    def obj(phase: str, **meta: str) -> dict[str, object]:
        return {
            "metadata": {"uid": "u", **meta},
            "spec": {"nodeName": "n1"},
            "status": {
                "phase": phase,
                "podIP": "10.0.0.5",
                "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
            },
        }

    assert pod_address(obj("Running")).ips == ("10.0.0.5", "fd00::5")
    for finished in (
        obj("Succeeded"),
        obj("Failed"),
        obj("Running", deletionTimestamp="2024-01-01T00:00:00Z"),
    ):
        assert pod_address(finished).ips == ()  # its IP may already be another pod's
