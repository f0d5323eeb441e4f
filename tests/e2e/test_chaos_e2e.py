"""Fault injection on the real local cluster, the operator as a real process (issue 19's suite).

Every test plays one reference workload, cheap to set up and judged within a minute: an Enforce
policy with a short idle clock and an hourly eviction budget (2, one a cycle) smaller than its three
idle bare pods, two busy pods, and one critical XID on a free GPU of the second node. Without faults
the operator evicts exactly two idle pods, leaves the third warned, taints the faulty node (xid)
and nothing else (``test_reference_run_without_faults``). Under each fault (API errors, hangs and
broken watches through a fault proxy; API server and etcd restarted; the leader stopped past its
lease; replicas with skewed clocks; forged series) the run must end with exactly the same actions,
none extra and none lost, and the policy status must say so. Each test adds a row to a table
printed at the end of the module (and written to ``chaos-table.txt`` under the basetemp).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.events import CLUSTER_EVENTS_NAMESPACE
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency_sim.faults import Fault as SimFault
from gpu_efficiency_sim.faults import FaultKind
from gpu_efficiency_sim.targets import DEFAULT_JOB, register, unregister
from tests.e2e.faultproxy import Fault, FaultProxy, Rule, apiserver_upstream, proxied_kubeconfig
from tests.e2e.harness import (
    CLUSTER_SH,
    Cluster,
    OperatorIdentity,
    OperatorProcess,
    prom_query,
    read_lease,
    wait_for,
)
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator  # noqa: F401
from tests.e2e.test_report import cli

pytestmark = pytest.mark.e2e

PROFILE = "sim.gpuefficiency.io/profile"
TAINT_KEY = "gpuefficiency.io/gpu-fault"
INTERVAL_S = 3.0
IDLE = ("idle-0", "idle-1", "idle-2")
BUSY = ("busy-0", "busy-1")
MAX_PER_HOUR = 2
SETTLE_CYCLES = 4  # cycles after the expected actions in which nothing more may happen
#: The skewed replica's clock offset: more than the 6 s lease, less than the part of the 12 s window
#: whose loss leaves minCoverage (0.3). The operator asks Prometheus at its own wall-clock time, so
#: a replica ahead by more than (1 - minCoverage) x window judges every GPU Unknown (safe, but idle).
SKEW_S = 7
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's faketime package


# ---- the table -----------------------------------------------------------------------------------


@dataclass
class Row:
    run: str
    faults: str
    cycles: int
    expected: str
    taken: str
    seconds: float
    recovery: str


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Row]]:
    rows: list[Row] = []
    yield rows
    header = "| run | faults injected | cycles | actions expected | actions taken | run (s) | recovery |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    lines += [
        f"| {r.run} | {r.faults} | {r.cycles} | {r.expected} | {r.taken} | {r.seconds:.0f} | {r.recovery} |"
        for r in rows
    ]
    text = "\n".join(lines)
    (tmp_path_factory.getbasetemp() / "chaos-table.txt").write_text(text + "\n")
    print("\n\nChaos suite (issue 19):\n" + text)


# ---- the reference workload ----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """The actions of one run: what was evicted, what was tainted, what the status counts."""

    evicted: tuple[str, ...]  # names of evicted pods (idle ones: which two may differ)
    taints: tuple[tuple[str, str], ...]  # (node, value) of our taint
    evictions_total: int
    recent_evictions: int

    def summary(self) -> str:
        taints = ",".join(f"{n.rsplit('-', 1)[-1]}:{v}" for n, v in self.taints) or "-"
        return (
            f"{len(self.evicted)} evicted ({'+'.join(sorted(self.evicted)) or '-'}), taint node {taints}, "
            f"status {self.evictions_total}/{self.recent_evictions}"
        )


EXPECTED_EVICTIONS = MAX_PER_HOUR


@dataclass
class Reference:
    k8s: client.ApiClient
    namespace: str
    nodes: GPUNodes
    sim: RunningSimulator
    policy: str
    operators: list[OperatorProcess] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.k8s)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def status(self) -> dict[str, Any]:
        obj = client.CustomObjectsApi(self.k8s).get_cluster_custom_object(GROUP, VERSION, PLURAL, self.policy)
        return dict(obj.get("status") or {})

    def pods(self) -> dict[str, client.V1Pod]:
        return {p.metadata.name: p for p in self.core.list_namespaced_pod(self.namespace).items}

    def outcome(self) -> Outcome:
        present = self.pods()
        evicted = tuple(
            sorted(n for n in (*IDLE, *BUSY) if n not in present or present[n].metadata.deletion_timestamp)
        )
        taints = []
        for node in self.nodes.names:
            for t in self.core.read_node(node).spec.taints or []:
                if t.key == TAINT_KEY:
                    taints.append((node, t.value or ""))
        status = self.status()
        return Outcome(
            evicted,
            tuple(sorted(taints)),
            int(status.get("evictionsTotal") or 0),
            len(status.get("recentEvictions") or []),
        )

    def cycles(self, *ops: OperatorProcess) -> int:
        """Cycle lines logged by ``ops`` (every replica when none is named)."""
        return sum(op.log().count(f"policy {self.policy}: cycle ") for op in ops or self.operators)

    def warned(self) -> list[str]:
        return [
            n
            for n, p in self.pods().items()
            if names.EVICT_AFTER in (p.metadata.annotations or {}) and not p.metadata.deletion_timestamp
        ]

    def expected(self) -> Outcome:
        """What the fault-free run does: two idle pods evicted, the XID node tainted."""
        return Outcome(("idle",) * EXPECTED_EVICTIONS, ((self.nodes.names[1], "xid"),), 2, 2)

    def matches(self, got: Outcome) -> bool:
        return (
            len(got.evicted) == EXPECTED_EVICTIONS
            and all(n in IDLE for n in got.evicted)
            and got.taints == self.expected().taints
            and (got.evictions_total, got.recent_evictions) == (EXPECTED_EVICTIONS, EXPECTED_EVICTIONS)
        )

    def settle(self, timeout: float = 150) -> Outcome:
        """Wait for the expected actions, then SETTLE_CYCLES more cycles in which nothing changes."""

        def done() -> Outcome | None:
            got = self.outcome()
            return got if self.matches(got) else None

        try:
            reached = wait_for(done, timeout, interval=1, what="the reference outcome")
        except AssertionError:
            raise AssertionError(
                f"outcome {self.outcome()} (expected {self.expected()})\nstatus {self.status()}\n{self.logs()}"
            ) from None
        start = self.cycles()
        wait_for(lambda: self.cycles() >= start + SETTLE_CYCLES, 60, what=f"{SETTLE_CYCLES} more cycles")
        final = self.outcome()
        assert final == reached, f"actions after the expected ones: {reached} -> {final}\n{self.logs()}"
        # The third idle pod stays warned: the budget holds it, it was not forgotten.
        left = [n for n in IDLE if n not in final.evicted]
        assert left, final
        assert set(left) <= set(self.warned()), (left, self.warned())
        return final

    def logs(self) -> str:
        return "\n".join(f"----- {op.name} -----\n{op.log()[-3000:]}" for op in self.operators)


def _pod(name: str, profile: str, node: str, nodes: GPUNodes) -> client.V1Pod:
    key, value = nodes.label
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}, annotations={PROFILE: profile}),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=1,
            node_selector={key: value, "kubernetes.io/hostname": node},
            tolerations=[client.V1Toleration(key=key, operator="Exists", effect="NoSchedule")],
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.k8s.io/pause:3.10",
                    resources=client.V1ResourceRequirements(limits={names.GPU_RESOURCE: "1"}),
                )
            ],
        ),
    )


@pytest.fixture
def reference(
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    prometheus_url: str,
) -> Iterator[Reference]:
    """The workload Running and the pods Running, the policy not yet created (no operator yet)."""
    core = client.CoreV1Api(k8s)
    first, second = gpu_nodes.names
    for name in IDLE:
        core.create_namespaced_pod(namespace, _pod(name, "idle", first, gpu_nodes))
    core.create_namespaced_pod(namespace, _pod("busy-0", "compute-bound", first, gpu_nodes))
    core.create_namespaced_pod(namespace, _pod("busy-1", "compute-bound", second, gpu_nodes))
    wait_for(
        lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items),
        60,
        what="the reference pods Running",
    )
    # The XID must rise from a scraped 0, as a real one does. A series Prometheus first sees already
    # at 79 (the target discovered after the fault began) is an XID older than anything the operator
    # saw, which by design is never new: without this wait the run raced the target's discovery.
    xid_zero = f'DCGM_FI_DEV_XID_ERRORS{{simulator="{simulator.target}", Hostname="{second}", gpu="3"}} == 0'
    wait_for(lambda: prom_query(prometheus_url, xid_zero), 60, what="the faulty GPU's XID scraped at 0")
    ref = Reference(k8s, namespace, gpu_nodes, simulator, f"chaos-{uuid.uuid4().hex[:6]}")
    yield ref
    try:
        client.CustomObjectsApi(k8s).delete_cluster_custom_object(GROUP, VERSION, PLURAL, ref.policy)
    except ApiException as exc:
        if exc.status != 404:
            raise


def create_policy(ref: Reference, **faults: Any) -> None:
    """The reference policy; ``faults`` adds to its ``spec.faults``."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": ref.policy},
        "spec": {
            "mode": "Enforce",
            "interval": f"{INTERVAL_S:.0f}s",
            "window": "12s",
            # minCoverage 0.3: the skewed replica's window (see the leader test) still holds data.
            "metrics": {"prometheus": {"scrapeInterval": "1s", "minCoverage": 0.3}},
            "selection": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ref.namespace}}
            },
            "idle": {"idleFor": "3s", "warningPeriod": "6s"},
            "eviction": {"allowBarePods": True, "maxPerHour": MAX_PER_HOUR, "maxPerCycle": 1},
            "faults": {
                "enabled": True,
                "lookback": "30s",
                "circuitBreaker": {"maxTaintedFraction": 1.0},
                **faults,
            },
        },
    }
    client.CustomObjectsApi(ref.k8s).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    ref.t0 = time.monotonic()
    # A critical XID (79, fallen off the bus) a few seconds in, on a free GPU of the second node.
    sim = ref.sim.sim
    sim.add_faults([SimFault(FaultKind.XID, at=sim.elapsed() + 4, node=ref.nodes.names[1], gpu=3, value=79)])


@pytest.fixture
def launch(
    operator_identity: OperatorIdentity,
    prometheus_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., OperatorProcess]]:
    """launch(ref, kubeconfig=..., env=...): an operator process (resumed and stopped at teardown)."""
    started: list[OperatorProcess] = []

    def start(
        ref: Reference, kubeconfig: str | None = None, env: dict[str, str] | None = None
    ) -> OperatorProcess:
        identity = operator_identity
        if kubeconfig is not None:
            identity = OperatorIdentity(identity.namespace, identity.service_account, kubeconfig)
        op = OperatorProcess(
            identity, prometheus_url, tmp_path, extra_args=("--api-timeout", "5"), env=dict(env or {})
        ).start()
        started.append(op)
        ref.operators.append(op)
        return op

    yield start
    for op in started:
        if op.alive():
            assert op.proc is not None
            os.killpg(op.proc.pid, signal.SIGCONT)
        op.stop()
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    if failed:
        for op in started:
            print(f"\n----- operator log {op.name} (last 4000 chars) -----\n{op.log()[-4000:]}")


@pytest.fixture
def api_proxy(cluster: Cluster, operator_identity: OperatorIdentity, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy in front of the API server; ``api_proxy.kubeconfig`` talks to it with the
    operator's ServiceAccount token."""
    proxy = FaultProxy(apiserver_upstream(cluster.kubeconfig)).start()
    proxy.kubeconfig = proxied_kubeconfig(operator_identity.kubeconfig, proxy.url, tmp_path)
    yield proxy
    proxy.stop()


def lease_holder(k8s: client.ApiClient) -> str:
    """The Lease's holder as written, live or not (the skewed-clock case judges liveness itself)."""
    lease = read_lease(k8s)
    return str(lease.spec.holder_identity or "") if lease is not None and lease.spec is not None else ""


def evicted_events(ref: Reference) -> dict[str, int]:
    """GPUIdleEvicted events by pod (events are best effort: a failed POST may lose one)."""
    events = ref.core.list_namespaced_event(ref.namespace, field_selector=f"reason={names.EV_EVICTED}")
    counts: dict[str, int] = {}
    for e in events.items:
        counts[e.involved_object.name] = counts.get(e.involved_object.name, 0) + (e.count or 1)
    return counts


def events_by(ref: Reference, instance: str) -> set[str]:
    """The events one replica reported (by its identity) in the test's and the cluster's namespace."""
    found: set[str] = set()
    for namespace in (ref.namespace, CLUSTER_EVENTS_NAMESPACE):
        for e in ref.core.list_namespaced_event(namespace).items:
            if e.reporting_instance == instance:
                found.add(f"{namespace}/{e.metadata.name}")
    return found


def first_eviction(ref: Reference, timeout: float = 90) -> None:
    wait_for(lambda: len(ref.outcome().evicted) >= 1, timeout, interval=0.3, what="the first eviction")


def cycle_after(ref: Reference, op: OperatorProcess | None = None, timeout: float = 90) -> float:
    """Seconds until the next completed cycle (of ``op``, or of any replica)."""
    ops = [op] if op is not None else ref.operators
    start, began = ref.cycles(*ops), time.monotonic()
    wait_for(
        lambda: ref.cycles(*ops) > start,
        timeout,
        interval=0.2,
        what="a completed cycle",
    )
    return time.monotonic() - began


def record(table: list[Row], run: str, faults: str, ref: Reference, got: Outcome, recovery: str) -> None:
    expected = f"{EXPECTED_EVICTIONS} evictions, taint xid"
    table.append(Row(run, faults, ref.cycles(), expected, got.summary(), ref.elapsed(), recovery))


def injected(proxy: FaultProxy) -> str:
    counts = proxy.injected()
    assert all(counts.values()), f"a fault never fired: {counts}\nrequests seen: {proxy.seen}"
    answered = {r.describe(): f" (server: {dict(r.upstream)})" for r in proxy.rules if r.upstream}
    return "; ".join(f"{n}x {what}{answered.get(what, '')}" for what, n in counts.items())


# ---- the runs ------------------------------------------------------------------------------------


def test_reference_run_without_faults(
    reference: Reference, launch: Callable[..., OperatorProcess], table: list[Row]
) -> None:
    launch(reference)
    create_policy(reference)
    got = reference.settle()
    assert sum(evicted_events(reference).values()) == EXPECTED_EVICTIONS
    assert set(evicted_events(reference)) == set(got.evicted)
    record(table, "reference", "none", reference, got, "-")


EVICTION = r"/pods/[^/]+/eviction$"
STATUS = r"/gpuefficiencypolicies/[^/]+/status$"
EVENTS = r"/events$"
NODE = r"^/api/v1/nodes/[^/?]+$"


def test_api_errors_on_every_write_change_no_action(
    reference: Reference, launch: Callable[..., OperatorProcess], api_proxy: FaultProxy, table: list[Row]
) -> None:
    """500, 429 (Retry-After) and 409 on the eviction POST, the status PATCH, the Event POST and the
    node PATCH (taint): every action is retried or counted as it really happened (finding 2)."""
    api_proxy.arm(
        [
            Rule("POST", EVICTION, Fault.STATUS, status=429, first=1),
            Rule("POST", EVICTION, Fault.STATUS, status=500, first=1),
            Rule("PATCH", STATUS, Fault.STATUS, status=500, first=2),
            Rule("PATCH", STATUS, Fault.STATUS, status=409, every=3),
            Rule("POST", EVENTS, Fault.STATUS, status=429, every=2),
            Rule("PATCH", NODE, Fault.STATUS, status=500, first=1),
            Rule("PATCH", NODE, Fault.STATUS, status=409, first=1),
        ]
    )
    op = launch(reference, kubeconfig=api_proxy.kubeconfig)
    create_policy(reference)
    got = reference.settle()
    faults = injected(api_proxy)
    assert "status write failed" in op.log(), "the failed status writes were not reported"
    recovery = time.monotonic() - api_proxy.last_injection
    record(table, "API write errors", faults, reference, got, f"last fault {recovery:.0f}s before the end")


def test_hangs_and_broken_watches_change_no_action(
    reference: Reference, launch: Callable[..., OperatorProcess], api_proxy: FaultProxy, table: list[Row]
) -> None:
    """Requests held past the API timeout (eviction, status, lease), watches dropped mid-stream or
    ended with 410 Gone, a trickled list (finding 7)."""
    api_proxy.arm(
        [
            # held far longer than the run: only the operator's own API timeout (5 s) ends them
            Rule("POST", EVICTION, Fault.HANG, seconds=600, first=1),
            Rule("PATCH", STATUS, Fault.HANG, seconds=600, first=1),
            Rule("PUT", r"/leases/", Fault.HANG, seconds=600, every=10),
            Rule("GET", r"^/api/v1/pods\?.*watch=", Fault.DROP, seconds=2, first=3),
            Rule("GET", r"^/api/v1/nodes\?.*watch=", Fault.GONE, first=2),
            Rule("GET", r"/gpuefficiencypolicies\?.*watch=", Fault.DROP, seconds=3, first=1),
            Rule("GET", r"^/api/v1/nodes\?(?!.*watch=)", Fault.TRICKLE, seconds=0.005, first=1),
        ]
    )
    op = launch(reference, kubeconfig=api_proxy.kubeconfig)
    create_policy(reference)
    got = reference.settle()
    faults = injected(api_proxy)
    assert op.alive()
    recovery = time.monotonic() - api_proxy.last_injection
    record(
        table, "hangs, dropped watches", faults, reference, got, f"last fault {recovery:.0f}s before the end"
    )


def test_evictions_committed_then_answered_504_count_against_the_budget(
    reference: Reference, launch: Callable[..., OperatorProcess], api_proxy: FaultProxy, table: list[Row]
) -> None:
    """Issue 31.2: every eviction reaches the API server and is applied, and the operator is answered
    504 all the same. Each is settled by re-reading the pod (gone or terminating: done), so the
    hour's budget (2) holds and the third idle pod stays warned (before: each counted as failed, the
    budget never filled and all three were evicted)."""
    api_proxy.arm([Rule("POST", EVICTION, Fault.COMMIT, status=504)])
    launch(reference, kubeconfig=api_proxy.kubeconfig)
    create_policy(reference)
    got = reference.settle()
    faults = injected(api_proxy)
    record(table, "eviction applied, answered 504", faults, reference, got, "settled by re-reading the pod")


OWNER_SCALE = r"/deployments/[^/]+/scale$"
JOB_PATCH = r"^/apis/batch/v1/namespaces/[^/]+/jobs/[^/?]+$"
DEPLOYMENTS, JOBS, OWNER_BUDGET = 12, 2, 3


def _template(name: str, nodes: GPUNodes) -> dict[str, Any]:
    key, value = nodes.label
    return {
        "metadata": {"labels": {"app": name}, "annotations": {PROFILE: "idle"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {key: value},
            "tolerations": [{"key": key, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {names.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


def _reclaimed_owners(k8s: client.ApiClient, namespace: str) -> list[str]:
    deployments = client.AppsV1Api(k8s).list_namespaced_deployment(namespace).items
    jobs = client.BatchV1Api(k8s).list_namespaced_job(namespace).items
    return sorted(
        [f"deployment/{d.metadata.name}" for d in deployments if d.spec.replicas == 0]
        + [f"job/{j.metadata.name}" for j in jobs if j.spec.suspend]
    )


@pytest.mark.parametrize("gpu_nodes", [8], indirect=True)
def test_owner_writes_committed_then_answered_504_hold_the_budget_and_stay_restorable(
    cluster: Cluster,
    k8s: client.ApiClient,
    namespace: str,
    gpu_nodes: GPUNodes,  # noqa: F811
    simulator: RunningSimulator,  # noqa: F811
    launch: Callable[..., OperatorProcess],
    api_proxy: FaultProxy,
    table: list[Row],
) -> None:
    """Issue 31.2's measurement: 12 idle Deployments and 2 idle Jobs, maxPerHour 3, and every /scale
    PATCH and Job suspend PATCH applied by the API server but answered 504. Each is settled by a
    re-read (at 0 replicas / suspended: done), so exactly 3 owners are reclaimed, the status counts
    3, and `gpu-efficiency restore` brings each back (before: all were reclaimed, the budget never
    counted one and the undo records were rolled back, so nothing was restorable). The Jobs are
    re-read by a LIST (the chart's role has no get on jobs); a /scale PATCH usually meets a real 409
    first (the undo record bumps the Deployment's generation and the deployment controller's status
    write lands before the PATCH), masked as 504 too: re-read at the replicas recorded, retried."""
    apps, batch, core = client.AppsV1Api(k8s), client.BatchV1Api(k8s), client.CoreV1Api(k8s)

    def running() -> int:
        return len([p for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Running"])

    # The Jobs first, so that their pods are idle longest and the budget goes to them first: the
    # suspend PATCH is exercised as well as the /scale.
    for i in range(JOBS):
        name = f"train-{i}"
        template = _template(name, gpu_nodes)
        template["spec"]["restartPolicy"] = "Never"
        batch.create_namespaced_job(
            namespace,
            {"metadata": {"name": name}, "spec": {"suspend": False, "backoffLimit": 0, "template": template}},
        )
    wait_for(lambda: running() == JOBS, 60, what="the Jobs' GPU pods Running")
    ref = Reference(k8s, namespace, gpu_nodes, simulator, f"chaos-owners-{uuid.uuid4().hex[:6]}")
    api_proxy.arm(
        [
            Rule("PATCH", OWNER_SCALE, Fault.COMMIT, status=504),
            Rule("PATCH", JOB_PATCH, Fault.COMMIT, status=504),
        ]
    )
    launch(ref, kubeconfig=api_proxy.kubeconfig)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": ref.policy},
        "spec": {
            "mode": "Enforce",
            "interval": f"{INTERVAL_S:.0f}s",
            "window": "12s",
            "metrics": {"prometheus": {"scrapeInterval": "1s", "minCoverage": 0.3}},
            "selection": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            "idle": {"idleFor": "3s", "warningPeriod": "6s"},
            "eviction": {
                "maxPerHour": OWNER_BUDGET,
                "maxPerCycle": OWNER_BUDGET,
                "maxPerNamespacePerCycle": OWNER_BUDGET,
            },
        },
    }
    custom = client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    try:
        ref.t0 = time.monotonic()
        wait_for(
            lambda: all(
                names.IDLE_SINCE in (p.metadata.annotations or {})
                for p in core.list_namespaced_pod(namespace).items
            ),
            90,
            what="the Jobs' pods judged idle",
        )
        for i in range(DEPLOYMENTS):
            name = f"idle-{i}"
            apps.create_namespaced_deployment(namespace, {
                "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": _template(name, gpu_nodes)},
            })  # fmt: skip
        wait_for(
            lambda: len(_reclaimed_owners(k8s, namespace)) >= OWNER_BUDGET, 150, what="the first reclaims"
        )
        start = ref.cycles()
        wait_for(lambda: ref.cycles() >= start + SETTLE_CYCLES, 60, what=f"{SETTLE_CYCLES} more cycles")
        reclaimed = _reclaimed_owners(k8s, namespace)
        status = ref.status()
        records = [r for r in status.get("reclamations") or [] if r.get("uid")]
        restored = [
            target for target in reclaimed if cli(cluster, "restore", target, "-n", namespace).returncode == 0
        ]
        summary = (
            f"{len(reclaimed)} of {DEPLOYMENTS + JOBS} owners reclaimed, status {len(status.get('recentEvictions') or [])}"
            f" in the hour, {len(restored)} restored"
        )
        assert len(reclaimed) == OWNER_BUDGET, f"{summary}: {reclaimed}\n{ref.logs()}"
        assert len(status.get("recentEvictions") or []) == OWNER_BUDGET, summary
        assert len(records) == OWNER_BUDGET, status.get("reclamations")
        assert restored == reclaimed, summary
        assert _reclaimed_owners(k8s, namespace) == [], "restore left an owner reclaimed"
        # Each was settled by a re-read the chart's role allows (a LIST by name for the Jobs, /scale
        # for the Deployments), none left unknown (before: the Jobs' GET answered 403).
        unknown = [
            line for op in ref.operators for line in op.log().splitlines() if "outcome unknown" in line
        ]
        assert not unknown, "\n".join(unknown)
        faults = injected(api_proxy)  # both rules fired: the Jobs' suspends and a /scale
        table.append(
            Row("owner writes applied, answered 504", faults, ref.cycles(), f"{OWNER_BUDGET} reclaims, all restorable",
                summary, ref.elapsed(), "settled by re-reading /scale and the Job")
        )  # fmt: skip
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, ref.policy)


def _component(cluster: Cluster, name: str, sig: int) -> None:
    assert cluster.state_dir is not None
    pid = int((cluster.state_dir / "run" / f"{name}.pid").read_text())
    os.killpg(pid, sig)


def test_api_server_and_etcd_restarted_mid_run(
    cluster: Cluster, reference: Reference, launch: Callable[..., OperatorProcess], table: list[Row]
) -> None:
    if cluster.state_dir is None:
        pytest.skip("GPUEFF_USE_EXISTING_CLUSTER: the cluster's API server is not ours to restart")
    launch(reference)
    create_policy(reference)
    first_eviction(reference)
    down = time.monotonic()
    _component(cluster, "kube-apiserver", signal.SIGKILL)
    _component(cluster, "etcd", signal.SIGKILL)
    time.sleep(3)
    env = {**os.environ, "GPUEFF_STATE_DIR": str(cluster.state_dir)}
    subprocess.run([str(CLUSTER_SH), "up"], env=env, check=True, capture_output=True, timeout=180)
    outage = time.monotonic() - down
    recovery = cycle_after(reference)
    got = reference.settle()
    record(
        table,
        "API server + etcd killed, restarted",
        f"SIGKILL after the 1st eviction, {outage:.0f}s down",
        reference,
        got,
        f"first cycle {recovery:.1f}s after the API server was back",
    )


def test_leader_stopped_past_its_lease_and_a_skewed_standby(
    reference: Reference, launch: Callable[..., OperatorProcess], table: list[Row]
) -> None:
    """Two replicas, the standby's wall clock 7 s ahead (libfaketime): an election on wall clocks
    would let it take the 6 s lease from a live leader (finding 3's split brain). The leader is SIGSTOPped after the first eviction, past its 6 s lease; the
    standby takes over and spends the one eviction left in the hour's budget (finding 2c); the old
    leader, resumed, does nothing."""
    if not Path(LIBFAKETIME).exists():
        pytest.fail(f"{LIBFAKETIME} missing: install Debian's faketime (`make deps`)")
    leader = launch(reference)
    wait_for(lambda: lease_holder(reference.k8s) == leader.name, 30, what="the first replica to lead")
    standby = launch(
        reference,
        env={"LD_PRELOAD": LIBFAKETIME, "FAKETIME": f"+{SKEW_S}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
    )
    create_policy(reference)
    first_eviction(reference)
    assert lease_holder(reference.k8s) == leader.name, "the skewed standby took the lease from a live leader"
    assert f"policy {reference.policy}: cycle " not in standby.log(), "the standby acted while the leader led"
    assert leader.proc is not None
    os.killpg(leader.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: lease_holder(reference.k8s) == standby.name, 30, what="the standby to take the lease")
    lease = client.CoordinationV1Api(reference.k8s).read_namespaced_lease(
        "gpu-efficiency-operator", "gpu-efficiency-system"
    )
    ahead = (lease.spec.acquire_time - datetime.now(UTC)).total_seconds()
    assert ahead > SKEW_S - 2, f"the standby's clock is not skewed (acquireTime {ahead:+.1f}s from now)"
    cycle_after(reference, standby)
    recovery = time.monotonic() - stopped
    time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))  # well past the 6 s lease
    resumed = reference.cycles(leader)
    written = events_by(reference, leader.name)  # stopped: it cannot write until SIGCONT
    assert written, "no event names the old leader as its reporting instance: it made the first eviction"
    os.killpg(leader.proc.pid, signal.SIGCONT)
    got = reference.settle()
    # The stop may land mid-cycle: that cycle then ends after SIGCONT and logs its line, its writes
    # left skipped by the applier's leadership guard. A second line would be a cycle begun as leader.
    assert reference.cycles(leader) - resumed <= 1, "the resumed old leader led"
    assert events_by(reference, leader.name) == written, "the resumed old leader wrote events"
    assert sum(evicted_events(reference).values()) == EXPECTED_EVICTIONS
    assert all(n == 1 for n in evicted_events(reference).values()), evicted_events(reference)
    record(
        table,
        f"leader SIGSTOP 10s, standby +{SKEW_S}s",
        f"SIGSTOP after the 1st eviction, SIGCONT after 10s; standby clock +{SKEW_S}s (libfaketime)",
        reference,
        got,
        f"standby's first cycle {recovery:.1f}s after the stop",
    )


class ForgedExporter:
    """A tenant's scrape target under the exporter's job (honorLabels lets a target set it), serving
    whatever series the test sets (text exposition, one line each)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = ("\n".join(owner.lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="forged-exporter", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def series_labels(prometheus_url: str, promql: str) -> dict[str, str]:
    """The labels of the first series ``promql`` answers (once scraped), less those Prometheus sets."""

    def first() -> dict[str, str] | None:
        result = prom_query(prometheus_url, promql)
        return result[0][0] if result else None

    labels = wait_for(first, 30, what=f"a series for {promql}")
    return {k: v for k, v in labels.items() if k not in ("__name__", "job", "instance", "simulator")}


def exposition(metric: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}} {value:g}"


def test_forged_series_from_a_tenant_target_change_no_action(
    cluster: Cluster,
    reference: Reference,
    launch: Callable[..., OperatorProcess],
    table: list[Row],
) -> None:
    """Finding 1's tenant attack: a second target exporting SM activity 0 for a busy pod's GPU, and
    a critical XID on a GPU UUID it invented with the Hostname of the node with the idle pods."""
    sim, (first, _) = reference.sim, reference.nodes.names
    busy = series_labels(
        cluster.prometheus_url, f'DCGM_FI_PROF_SM_ACTIVE{{simulator="{sim.target}", pod="busy-1"}}'
    )
    node = series_labels(
        cluster.prometheus_url, f'DCGM_FI_DEV_XID_ERRORS{{simulator="{sim.target}", Hostname="{first}"}}'
    )
    invented = {**node, "UUID": f"GPU-{uuid.uuid4()}", "gpu": "7", "device": "nvidia7"}
    for key in ("pod", "namespace", "container"):
        invented.pop(key, None)
    forger = ForgedExporter()
    forger.lines = [
        exposition("DCGM_FI_PROF_SM_ACTIVE", busy, 0),
        exposition("DCGM_FI_DEV_XID_ERRORS", invented, 0),
        exposition("DCGM_FI_DEV_GPU_UTIL", invented, 0),  # so that it is a GPU the operator sees
    ]
    assert cluster.prometheus_targets_dir() is not None
    target = register(
        f"forger-{uuid.uuid4().hex[:6]}",
        [forger.address],
        directory=cluster.prometheus_targets_dir(),
        labels={"job": DEFAULT_JOB, "tenant": "forger"},
        node_local=False,  # a tenant's pod: scraped at its own address, on no GPU node
    )
    try:
        launch(reference)
        create_policy(reference)
        time.sleep(4)  # the XID rises from 0, as a real one does
        forger.lines[1] = exposition("DCGM_FI_DEV_XID_ERRORS", invented, 79)
        got = reference.settle()
        assert "busy-1" not in got.evicted
        # Reported with the next status write (a change, or the 30 s refresh).
        dropped = wait_for(
            lambda: reference.status().get("droppedSamples") or {},
            40,
            what="the dropped samples in the status",
        )
        # The invented GPU's identity comes from a target on no node: dropped at the source (rule
        # 10), before it could fill node 0's capacity (gpus-exceed-capacity, the rule-9 check).
        assert dropped.get("identity-off-node"), f"the invented GPU was not reported: {dropped}"
    finally:
        unregister(target)
        forger.stop()
    record(
        table,
        "forged tenant series",
        "SM_ACTIVE 0 for busy-1's GPU; XID 79 on an invented UUID of node 0",
        reference,
        got,
        f"droppedSamples {dropped}",
    )


def test_forged_xids_on_a_real_gpu_change_no_action(
    cluster: Cluster,
    reference: Reference,
    launch: Callable[..., OperatorProcess],
    table: list[Row],
) -> None:
    """Issue 31.1: a tenant's target publishes XID 48 with the UUID and Hostname of the real GPU
    busy-0 runs on (node 0), rising from 0 as a real one does, under a policy that drains before a
    NoExecute XID taint. Only the simulator's real XID (node 1, its own exporter) quarantines:
    node 1 gets the NoExecute taint after its GPU pod busy-1 is drained; node 0 is never tainted,
    busy-0 never drained, and the forged series are counted in droppedSamples."""
    sim, (first, second) = reference.sim, reference.nodes.names
    real = series_labels(
        cluster.prometheus_url, f'DCGM_FI_PROF_SM_ACTIVE{{simulator="{sim.target}", pod="busy-0"}}'
    )
    assert real["Hostname"] == first, real
    forger = ForgedExporter()
    forger.lines = [
        exposition("DCGM_FI_DEV_XID_ERRORS", real, 0),
        exposition("DCGM_FI_DEV_GPU_UTIL", real, 100),  # its identity too, from the wrong place
    ]
    assert cluster.prometheus_targets_dir() is not None
    target = register(
        f"forger-{uuid.uuid4().hex[:6]}",
        [forger.address],
        directory=cluster.prometheus_targets_dir(),
        labels={"job": DEFAULT_JOB, "tenant": "forger"},
        node_local=False,
    )

    def xid_effects(node: str) -> list[str]:
        taints = reference.core.read_node(node).spec.taints or []
        return [t.effect for t in taints if t.key == TAINT_KEY and t.value == "xid"]

    try:
        launch(reference)
        create_policy(reference, xid={"effect": "NoExecute"}, drainTimeout="60s")
        time.sleep(4)  # the XID rises from 0, as a real one does (and as the simulator's does)
        forger.lines[0] = exposition("DCGM_FI_DEV_XID_ERRORS", real, 48)
        wait_for(lambda: xid_effects(second) == ["NoExecute"], 120, what="the real XID's NoExecute taint")
        wait_for(
            lambda: len([n for n in reference.outcome().evicted if n in IDLE]) == EXPECTED_EVICTIONS,
            120,
            what="the idle evictions",
        )
        start = reference.cycles()
        wait_for(lambda: reference.cycles() >= start + SETTLE_CYCLES, 60, what=f"{SETTLE_CYCLES} more cycles")
        got = reference.outcome()
        assert xid_effects(first) == [], reference.logs()
        assert "busy-0" not in got.evicted, got
        assert "busy-1" in got.evicted, got  # the real fault's node: drained, then NoExecute
        dropped = wait_for(
            lambda: (d := reference.status().get("droppedSamples") or {}).get("fault-off-target") and d,
            40,
            what="the forged XID counted in droppedSamples",
        )
        assert dropped.get("identity-off-node"), dropped
    finally:
        unregister(target)
        forger.stop()
    record(
        table,
        "forged XID on a real GPU",
        "XID 48 with busy-0's GPU UUID and node 0's Hostname from a tenant target; xid NoExecute",
        reference,
        got,
        f"node 0 untainted, busy-0 kept; droppedSamples {dropped}",
    )
