"""Scale benchmark: the operator as a real process against 100 / 300 / 1,000 KWOK nodes x 8 GPUs.

    python bench/scale/run.py [--nodes 100,300,1000] [--gpus-per-node 8] [--keep-cluster]
    python bench/scale/run.py --nodes 10,30          # quick run (~10 min)
    python bench/scale/run.py --nodes 1000 --refresh-budget 500 --steady-cycles 6
                                                     # the figures of docs/developing.md (~13 min)

The targets of docs/developing.md at 1,000 nodes (steady cycle under 2 s) are for the operator with
``--prometheus-refresh-budget 500``, as the last command runs it. Without a budget (the default
here, 0) every steady cycle fetches every GPU's whole window: 568,000 series, ~8 s at 1,000 nodes.

What it does (see RESULTS.md for the figures and how to read them):

1. Brings up a local cluster of its own (hack/localcluster/cluster.sh with GPUEFF_STATE_DIR
   /tmp/gpueff-scale and the 3xxxx ports unless set; Prometheus scraping every 15 s). An existing
   cluster in that state dir holding bench objects is purged first (--reuse keeps it).
2. Installs the CRD and the chart's RBAC, and gives the operator a ServiceAccount token (so API
   priority and fairness treats it like the real deployment, not like an exempt admin).
3. Starts the DCGM simulator (8 targets, each GPU rendered once per scrape interval, the nodes listed
   every 30 s: --sim-render, --sim-node-poll) and, per size, grows the cluster: KWOK nodes
   (cluster.sh add-nodes), one single-GPU bare pod per GPU over 50 namespaces (bound to its node
   directly, created by a bounded thread pool), profiles mostly compute-bound or underutilized with
   some idle. Waits until every pod is Running, attributed by the simulator and older than the
   window, with a full window of samples in Prometheus.
4. Starts the operator (bench/scale/probe.py: `gpu-efficiency run` plus a trace of API calls,
   PromQL queries and cycle phases) with one cluster-wide Observe policy (interval 30s, window 2m,
   scrapeInterval 15s). Cycle 1 labels the new pods; the next --steady-cycles cycles are the steady
   state. Then the operator is restarted (a new process, caches and memory empty, on pods that carry
   its annotations): its first cycle's time and writes are recorded (a restart is not a relabelling:
   0 writes expected). Then 5 % of the busy pods are flipped to the idle profile (annotation read by the
   simulator) and every cycle is recorded until the operator counts them all Idle.
5. With --reclaim, at the last size: the policy turns to Enforce (bare pods allowed, idleFor 1m,
   warningPeriod 30s, at most 40 evictions a cycle, 1 per namespace a cycle, 300 an hour), and
   every cycle is recorded until the hour's budget is spent: the idle pods are warned, then
   evicted, and the evictions per cycle and per namespace are checked against the budgets.
6. Prints a table and writes bench/results/scale-<timestamp>.json.

Figures per cycle: wall (the operator's own timing), process CPU seconds, phases, peak RSS
(VmHWM), PromQL queries and their latency, API requests by verb (counted in the operator's
kubernetes client), writes; 429s from the client and from the API server's metrics.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.sources.metrics.prometheus import PrometheusClient, PrometheusConfig
from gpu_efficiency_sim.gpu_models import CLUSTER_MODELS
from gpu_efficiency_sim.manifests import cluster_nodes

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "hack" / "localcluster" / "cluster.sh"
CHART = ROOT / "charts" / "gpu-efficiency-operator"
PROBE = Path(__file__).resolve().parent / "probe.py"

SCALE_ENV = {
    "GPUEFF_STATE_DIR": "/tmp/gpueff-scale",
    # Above Linux's ephemeral range (32768-60999): a client connection holding one of these as its
    # local port made a component fail to bind (twice in one day, at 39090 and 37247).
    "GPUEFF_ETCD_PORT": "61379",
    "GPUEFF_ETCD_PEER_PORT": "61380",
    "GPUEFF_APISERVER_PORT": "61443",
    "GPUEFF_KCM_PORT": "61257",
    "GPUEFF_SCHEDULER_PORT": "61259",
    "GPUEFF_KWOK_PORT": "61247",
    "GPUEFF_PROM_PORT": "61090",
    # VictoriaMetrics (--metrics), away from the e2e clusters' 184xx/185xx
    "GPUEFF_VM_PORT": "61428",
    "GPUEFF_VMAGENT_PORT": "61429",
    "GPUEFF_VMINSERT_PORT": "61480",
    "GPUEFF_VMSELECT_PORT": "61481",
    "GPUEFF_VMSTORAGE_PORT_BASE": "61500",  # vmstorage N: 61500+10N .. +2
    # Fake nodes post status every 5-5.5 min, as kubelets with node leases do (the local cluster's
    # default, 20-30 s, costs the API server ~0.6 core at 1,000 nodes on the cores we measure on).
    "GPUEFF_KWOK_NODE_STATUS_PERIOD_S": "300",
    # Fake nodes renew their leases every 150 s instead of a kubelet's 10 s: at 1,000 nodes the
    # renewals cost the API server, etcd and KWOK ~0.5 core of the cores we measure on, which in a
    # real cluster are the control plane's own (the operator reads no lease). The node lifecycle
    # controller's grace period follows (hack/localcluster/cluster.sh), so the nodes stay Ready.
    "GPUEFF_KWOK_NODE_LEASE_DURATION_S": "600",
}
SCRAPE_INTERVAL_S = 15
OPERATOR_NAMESPACE = "gpu-efficiency-system"
POLICY = "scale-bench"
PART_OF = "app.kubernetes.io/part-of"
BENCH = "gpueff-scale-bench"
PROFILE_ANNOTATION = "sim.gpuefficiency.io/profile"
IDLE_SINCE = "gpuefficiency.io/idle-since"
EVICT_AFTER = "gpuefficiency.io/evict-after"
#: --reclaim: the policy turned to Enforce after the flip. Budgets small enough that each binds
#: within minutes at 1,000 nodes (50 namespaces x 1 > 40 a cycle; 300 an hour < the ~1,200 idle pods).
RECLAIM_BUDGETS = {"maxPerCycle": 40, "maxPerNamespacePerCycle": 1, "maxPerHour": 300}
RECLAIM_IDLE = {"idleFor": "1m", "warningPeriod": "30s"}
NODE_PREFIX = "scale-"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

#: Mostly compute-bound or underutilized, some idle: profiles whose 2-minute averages are steady at a
#: 15 s scrape. Not input-starved, communication-bound or bursty-inference: the simulator serves
#: instantaneous values of their 1.5-10 s phases (real DCGM averages profiling fields over its
#: sampling interval), so a 15 s scrape aliases them and their window averages swing by 0.1-0.4
#: from cycle to cycle, across diagnosis thresholds; the operator then rightly rewrites the
#: annotations. No thermal or memory-pressure profile: those are faults and trends, not a steady state.
PROFILE_MIX = (
    ("compute-bound", 0.55),
    ("memory-bound", 0.10),
    ("no-tensor-cores", 0.10),
    ("low-occupancy", 0.08),
    ("fake-load", 0.07),
    ("idle", 0.05),
    ("idle-holding-memory", 0.05),
)
IDLE_PROFILES = frozenset({"idle", "idle-holding-memory"})


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ cluster --


@dataclass
class Cluster:
    env: dict[str, str]
    kubeconfig: str
    prometheus_url: str
    state_dir: Path
    bin_dir: Path
    api: client.ApiClient = field(init=False)
    prometheus: PrometheusClient = field(init=False)

    def __post_init__(self) -> None:
        self.prometheus = PrometheusClient(PrometheusConfig(url=self.prometheus_url, timeout=30))
        configuration = client.Configuration()
        kube_config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        configuration.connection_pool_maxsize = 32
        self.api = client.ApiClient(configuration)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def sh(self, *args: str, input_: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(args, input=input_, capture_output=True, text=True, env=self.env, timeout=900)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc.stdout

    def kubectl(self, *args: str, input_: str | None = None, check: bool = True) -> str:
        return self.sh(
            str(self.bin_dir / "kubectl"), "--kubeconfig", self.kubeconfig, *args, input_=input_, check=check
        )

    def prom(self, query: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        return self.prometheus.query(query, at)

    def prom_scalar(self, query: str) -> float:
        result = self.prom(query)
        return result[0][1] if result else 0.0

    def apiserver_metrics(self) -> str:
        import ssl

        pki = self.state_dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        port = self.env["GPUEFF_APISERVER_PORT"]
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=30) as response:
            text: str = response.read().decode()
            return text


def cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in SCALE_ENV.items():
        env.setdefault(key, value)
    env["GPUEFF_PROM_SCRAPE_INTERVAL"] = f"{SCRAPE_INTERVAL_S}s"
    if env["GPUEFF_STATE_DIR"].rstrip("/") == "/tmp/gpueff-localcluster":
        raise SystemExit("refusing to use the default local cluster's state dir: set GPUEFF_STATE_DIR")
    return env


def cluster_up(env: dict[str, str], reuse: bool, metrics: str = "prometheus") -> Cluster:
    state = Path(env["GPUEFF_STATE_DIR"])
    if not reuse and (state / "etcd").exists():
        log(f"purging the previous scale cluster in {state}")
        subprocess.run(
            [str(CLUSTER_SH), "down", "--purge"], env=env, capture_output=True, text=True, check=True
        )
    t0 = time.monotonic()
    up = subprocess.run(
        [str(CLUSTER_SH), "up", "--nodes", "0", "--metrics", metrics], env=env, capture_output=True, text=True
    )
    if up.returncode != 0:
        raise SystemExit(f"cluster.sh up failed:\n{up.stderr[-4000:]}")
    prom_yml = (state / "prometheus" / "prometheus.yml").read_text()
    if f"scrape_interval: {SCRAPE_INTERVAL_S}s" not in prom_yml and metrics == "prometheus":
        log("Prometheus runs with another scrape interval: restarting it with 15s")
        for verb in ("prometheus-down", "prometheus-up"):
            subprocess.run([str(CLUSTER_SH), verb], env=env, capture_output=True, text=True, check=True)
    log(f"cluster up in {time.monotonic() - t0:.0f}s ({state})")
    return running_cluster(env, state)


def running_cluster(env: dict[str, str], state: Path) -> Cluster:
    """The cluster ``cluster.sh`` runs for ``env``, as ``cluster.sh env`` describes it."""
    out = subprocess.run([str(CLUSTER_SH), "env"], env=env, capture_output=True, text=True, check=True).stdout
    values = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines() if "=" in line)
    return Cluster(
        env=env,
        kubeconfig=values["KUBECONFIG"],
        prometheus_url=values["GPUEFF_PROMETHEUS_URL"],
        state_dir=state,
        bin_dir=Path(values["GPUEFF_LOCALCLUSTER_BIN"]),
    )


BACKENDS = ("prometheus", "victoriametrics", "victoriametrics-cluster")


@dataclass(frozen=True)
class Backend:
    """A metrics backend the operator is pointed at: its query URL, the URLs whose
    ``process_cpu_seconds_total`` add up to its CPU (every process of a VictoriaMetrics cluster,
    its ingestion included, as Prometheus' own figure includes its scrapes), and the operator's
    refresh budget against it (``name@budget`` on the command line)."""

    name: str
    url: str
    cpu_urls: tuple[str, ...]
    refresh_budget: int = 0

    @property
    def label(self) -> str:
        return f"{self.name}@{self.refresh_budget}" if self.refresh_budget else self.name


def parse_backends(spec: str, default_budget: int) -> list[Backend]:
    """``--metrics``: a comma list of ``name[@budget]``; the first is the cluster's own (``cluster.sh
    up --metrics``), the others run beside it; URLs are filled in by :func:`backend_urls`."""
    out = []
    for item in spec.split(","):
        name, _, budget = item.strip().partition("@")
        if name not in BACKENDS:
            raise SystemExit(f"--metrics: {name!r} is none of {', '.join(BACKENDS)}")
        if budget and not budget.isdigit():
            raise SystemExit(f"--metrics: the budget in {item!r} is not a whole number")
        out.append(Backend(name, "", (), int(budget) if budget else default_budget))
    if len({b.label for b in out}) != len(out):
        raise SystemExit(f"--metrics names a backend twice: {spec}")
    return out


def backend_urls(env: dict[str, str], backend: Backend) -> Backend:
    """The backend with the local cluster's URLs for it (cluster.sh's ports, from ``env``)."""
    host = "http://127.0.0.1"
    if backend.name == "prometheus":
        url = f"{host}:{env['GPUEFF_PROM_PORT']}"
        return Backend(backend.name, url, (url,), backend.refresh_budget)
    if backend.name == "victoriametrics":
        url = f"{host}:{env['GPUEFF_VM_PORT']}"
        return Backend(backend.name, url, (url,), backend.refresh_budget)
    select = f"{host}:{env['GPUEFF_VMSELECT_PORT']}"
    base = int(env["GPUEFF_VMSTORAGE_PORT_BASE"])
    cpu = (
        select,
        f"{host}:{env['GPUEFF_VMINSERT_PORT']}",
        f"{host}:{env['GPUEFF_VMAGENT_PORT']}",
        *(f"{host}:{base + 10 * n}" for n in (1, 2)),
    )
    return Backend(backend.name, f"{select}/select/0/prometheus", cpu, backend.refresh_budget)


def start_beside(env: dict[str, str], name: str) -> None:
    """Another backend scraping the same targets beside the cluster's own (cluster.sh)."""
    verb = {
        "prometheus": ["prometheus-up"],
        "victoriametrics": ["victoriametrics-up"],
        "victoriametrics-cluster": ["victoriametrics-up", "--cluster"],
    }[name]
    proc = subprocess.run([str(CLUSTER_SH), *verb], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"cluster.sh {' '.join(verb)} failed:\n{proc.stderr[-4000:]}")
    log(f"{name} up beside the cluster's backend")


def install_crd_and_rbac(cluster: Cluster, workdir: Path) -> str:
    """The CRD, the chart's RBAC and a kubeconfig with the operator ServiceAccount's token."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/gpuefficiencypolicies.gpuefficiency.io"
    )
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    rendered = cluster.sh(
        str(cluster.bin_dir / "helm"), "template", "scale", str(CHART), "--namespace", OPERATOR_NAMESPACE
    )
    docs = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") in RBAC_KINDS]
    cluster.kubectl("apply", "-n", OPERATOR_NAMESPACE, "-f", "-", input_=yaml.safe_dump_all(docs))
    sa = next(
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount" and "agent" not in d["metadata"]["name"]
    )
    token = cluster.core.create_namespaced_service_account_token(
        sa,
        OPERATOR_NAMESPACE,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc"], expiration_seconds=86400
            )
        ),
    ).status.token
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": sa}}],
        "current-context": "operator",
    }
    path = workdir / "operator-kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    path.chmod(0o600)
    return str(path)


def create_namespaces(cluster: Cluster, count: int) -> list[str]:
    names = [f"scale-ns-{i:02d}" for i in range(count)]
    core = cluster.core
    for name in names:
        try:
            core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={PART_OF: BENCH}))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        body = orjson.loads(
            core.list_service_account_for_all_namespaces(
                field_selector="metadata.name=default", _preload_content=False
            ).data
        )
        have = {(i.get("metadata") or {}).get("namespace") for i in body.get("items") or ()}
        if all(n in have for n in names):
            return names
        time.sleep(0.5)
    raise RuntimeError("default ServiceAccounts were not created in the bench namespaces")


def apply_policy(cluster: Cluster, mode: str, interval: str, window: str, query_timeout: str) -> None:
    policy = {
        "apiVersion": "gpuefficiency.io/v1alpha1",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "mode": mode,
            "interval": interval,
            "window": window,
            # queryTimeout: at 8,000 GPUs Prometheus needs longer than the default 10s on a small
            # shared machine (see RESULTS.md); the cycle would report MetricsAvailable=False.
            "metrics": {
                "prometheus": {"scrapeInterval": f"{SCRAPE_INTERVAL_S}s", "queryTimeout": query_timeout}
            },
            # Generous budgets: only matter in Enforce mode (bare pods are never evicted by default).
            "eviction": {"maxPerCycle": 1000, "maxPerHour": 10000, "maxPerNamespacePerCycle": 1000},
        },
    }
    cluster.kubectl("apply", "-f", "-", input_=yaml.safe_dump(policy))


# --------------------------------------------------------------------------------------- workload --


def node_names(cluster: Cluster) -> list[str]:
    body = orjson.loads(cluster.core.list_node(_preload_content=False).data)
    return [
        n["metadata"]["name"]
        for n in body.get("items") or ()
        if n["metadata"]["name"].startswith(NODE_PREFIX)
    ]


def node_body(index: int, gpus: int) -> dict[str, Any]:
    """Node ``index`` as cluster.sh add-nodes creates it (the harness's catalogue), models alternating."""
    body = cluster_nodes(NODE_PREFIX, index, 1, [m.product for m in CLUSTER_MODELS], gpus)[0]
    body["metadata"]["labels"][PART_OF] = BENCH
    return body


def add_nodes(cluster: Cluster, total: int, gpus: int, workers: int, timeout: float = 300) -> None:
    """Nodes scale-0..total-1 (the shape of `cluster.sh add-nodes`, created through the API in
    parallel: the script waits for each node with its own kubectl call, minutes at 1,000 nodes)."""
    have = set(node_names(cluster))
    todo = [i for i in range(total) if f"{NODE_PREFIX}{i}" not in have]
    core = cluster.core

    def create(i: int) -> None:
        try:
            core.create_node(node_body(i, gpus), _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, todo))
    deadline = time.monotonic() + timeout
    ready = 0
    while time.monotonic() < deadline:
        body = orjson.loads(core.list_node(_preload_content=False).data)
        ready = sum(
            1
            for n in body.get("items") or ()
            if n["metadata"]["name"].startswith(NODE_PREFIX)
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or ()
            )
        )
        if ready >= total:
            return
        time.sleep(1)
    raise RuntimeError(f"only {ready}/{total} nodes Ready after {timeout:.0f}s")


def pick_profile(name: str) -> str:
    rng = random.Random(name)
    return rng.choices([p for p, _ in PROFILE_MIX], [w for _, w in PROFILE_MIX])[0]


def pod_body(name: str, namespace: str, node: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {PART_OF: BENCH, "app": name.rsplit("-g", 1)[0]},
            "annotations": {PROFILE_ANNOTATION: profile},
        },
        "spec": {
            "nodeName": node,  # bound directly: the scheduler would take minutes for 8,000 pods
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def list_bench_pods(cluster: Cluster) -> list[dict[str, Any]]:
    body = orjson.loads(
        cluster.core.list_pod_for_all_namespaces(
            label_selector=f"{PART_OF}={BENCH}", _preload_content=False
        ).data
    )
    items: list[dict[str, Any]] = body.get("items") or []
    return items


def create_pods(
    cluster: Cluster, nodes: int, gpus: int, namespaces: list[str], workers: int
) -> dict[str, str]:
    """One single-GPU pod per GPU of nodes scale-0..N-1; returns {namespace/name: profile} of all.

    A reused pod's profile is the one its annotation says now (an earlier run may have flipped it
    to idle), so a flip never picks a pod that is already idle.
    """
    current = {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": (p["metadata"].get("annotations") or {}).get(
            PROFILE_ANNOTATION, ""
        )
        for p in list_bench_pods(cluster)
    }
    existing = set(current)
    wanted: dict[str, tuple[str, str, str, str]] = {}
    for i in range(nodes):
        node = f"{NODE_PREFIX}{i}"
        for k in range(gpus):
            name = f"{node}-g{k}"
            namespace = namespaces[(i * gpus + k) % len(namespaces)]
            wanted[f"{namespace}/{name}"] = (namespace, name, node, pick_profile(name))
    todo = [v for key, v in wanted.items() if key not in existing]
    core = cluster.core

    def create(item: tuple[str, str, str, str]) -> None:
        namespace, name, node, profile = item
        for attempt in range(5):
            try:
                core.create_namespaced_pod(
                    namespace, pod_body(name, namespace, node, profile), _preload_content=False
                )
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                if exc.status in (429, 500, 503) and attempt < 4:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, todo))
    log(f"created {len(todo)} pods in {time.monotonic() - t0:.1f}s ({workers} threads)")
    return {key: current.get(key) or v[3] for key, v in wanted.items()}


def wait_running(cluster: Cluster, expected: int, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    running = 0
    while time.monotonic() < deadline:
        body = orjson.loads(
            cluster.core.list_pod_for_all_namespaces(
                label_selector=f"{PART_OF}={BENCH}",
                field_selector="status.phase=Running",
                _preload_content=False,
            ).data
        )
        running = len(body.get("items") or ())
        if running >= expected:
            return time.time()
        time.sleep(2)
    raise RuntimeError(f"only {running}/{expected} pods Running after {timeout:.0f}s")


def wait_attributed(
    cluster: Cluster, expected: int, sim: subprocess.Popen[bytes], timeout: float = 300
) -> float:
    """Until the simulator serves every pod's GPU and Prometheus has scraped it."""
    deadline = time.monotonic() + timeout
    seen = 0.0
    while time.monotonic() < deadline:
        if sim.poll() is not None:
            raise RuntimeError(f"the simulator exited ({sim.returncode}); see simulator.log")
        seen = cluster.prom_scalar(f'count(DCGM_FI_DEV_GPU_UTIL{{pod=~"{NODE_PREFIX}.*"}})')
        if seen >= expected:
            return time.time()
        time.sleep(3)
    raise RuntimeError(f"Prometheus has {seen:.0f}/{expected} attributed GPUs after {timeout:.0f}s")


def flip_to_idle(cluster: Cluster, pods: list[str], workers: int) -> None:
    core = cluster.core
    body = {"metadata": {"annotations": {PROFILE_ANNOTATION: "idle"}}}

    def patch(key: str) -> None:
        namespace, name = key.split("/", 1)
        core.patch_namespaced_pod(
            name, namespace, body, _content_type="application/merge-patch+json", _preload_content=False
        )

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(patch, pods))


# --------------------------------------------------------------------------------------- processes --


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_simulator(
    cluster: Cluster, workdir: Path, targets: int, port: int, render_s: float, node_poll_s: float
) -> subprocess.Popen[bytes]:
    """The simulator on fixed ports (``port``..``port+targets-1``): a ``--reuse`` run then scrapes the
    same ``instance``s, where free ports would give Prometheus a new copy of every series per run
    (measured: 1.05 M head series after three simulator starts, each query and GC slower). It renders
    every ``render_s`` and lists the nodes every ``node_poll_s`` (``--sim-render``, ``--sim-node-poll``)."""
    env = {**cluster.env, "KUBECONFIG": cluster.kubeconfig, "PYTHONUNBUFFERED": "1"}
    log_file = (workdir / "simulator.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable, "-m", "gpu_efficiency_sim", "serve",
            "--targets", str(targets), "--port", str(port), "--prerender", str(render_s),
            "--node-poll", str(node_poll_s), "--register", "scale-bench",
        ],
        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    trace: Path
    log_path: Path
    metrics_port: int
    offset: int = 0
    cycles: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)

    def poll(self) -> None:
        if not self.trace.exists():
            return
        with self.trace.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            record = orjson.loads(line)
            kind = record.get("k")
            if kind == "cycle":
                if record.get("ran"):
                    self.cycles.append(record)
            elif kind == "api":
                self.calls.append(record)
            elif kind == "prom":
                self.queries.append(record)

    def wait_cycles(self, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if len(self.cycles) >= count:
                return self.cycles
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.proc.returncode}); see {self.log_path}")
            time.sleep(0.5)
        raise RuntimeError(
            f"only {len(self.cycles)}/{count} cycles after {timeout:.0f}s; see {self.log_path}"
        )

    def wait_background(self, since: float, timeout: float) -> bool:
        """Wait until a background refresh query started after ``since`` has been traced."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if any(q.get("bg") and q["t"] >= since for q in self.queries):
                return True
            time.sleep(0.5)
        return False

    def proc_status(self) -> dict[str, int]:
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(rest.split()[0])
        return out

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def gauge(self, name: str, labels: dict[str, str]) -> float | None:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10
            ) as response:
                text = response.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None


def start_operator(
    cluster: Cluster,
    workdir: Path,
    kubeconfig: str,
    tag: str,
    refresh_budget: int = 0,
    backend: Backend | None = None,
) -> Operator:
    """The operator against ``backend`` (the cluster's recorded one, Prometheus by default)."""
    url = backend.url if backend else cluster.prometheus_url
    cpu_urls = backend.cpu_urls if backend else (cluster.prometheus_url,)
    trace = workdir / f"trace-{tag}.jsonl"
    log_path = workdir / f"operator-{tag}.log"
    trace.unlink(missing_ok=True)
    port = free_port()
    env = {
        **cluster.env,
        "KUBECONFIG": kubeconfig,
        "PYTHONUNBUFFERED": "1",
        "GPUEFF_PROBE_PROMETHEUS_URL": ",".join(cpu_urls),
    }
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable, str(PROBE), str(trace), "run",
                "--prometheus-url", url, "--namespace", OPERATOR_NAMESPACE,
                "--no-leader-election", "--metrics-port", str(port), "--health-port", "0",
                "--prometheus-refresh-budget", str(refresh_budget),
            ],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    return Operator(proc=proc, trace=trace, log_path=log_path, metrics_port=port)


def restart_operator(
    op: Operator, cluster: Cluster, workdir: Path, kubeconfig: str, tag: str, opts: Options
) -> tuple[Operator, dict[str, Any]]:
    """Stop the operator and start a new process (no memory of its writes, caches empty) on pods
    that carry its annotations: its first cycle should write nothing for pods whose values did
    not move (issue 35.6). Returns the new operator and its first cycle's summary, with the pods
    it patched and the keys of each patch (what it rewrote, if anything)."""
    stop(op.proc)
    new = start_operator(cluster, workdir, kubeconfig, tag, opts.refresh_budget)
    try:
        new.wait_cycles(1, 600.0)
    except BaseException:
        stop(new.proc)
        raise
    summary = cycle_summary(new, new.cycles[0])
    calls = in_cycle(new.calls, new.cycles[0])
    keys = Counter(
        key for c in calls if c["m"] == "PATCH" and _POD_PATH.match(c["p"]) for key in c.get("keys", ())
    )
    summary["patched_keys"] = dict(keys.most_common())
    return new, summary


# ---------------------------------------------------------------------------------------- analysis --

_POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/?]+)")


def classify(call: dict[str, Any]) -> str:
    """'VERB resource' as the API server would count it."""
    path, _, query = call["p"].partition("?")
    parts = [p for p in path.split("/") if p]
    # /api/v1/... or /apis/group/version/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] if rest else "?"
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    method = call["m"]
    if method == "GET":
        verb = "WATCH" if "watch=true" in query or "watch=True" in query else ("GET" if named else "LIST")
    else:
        verb = {"POST": "CREATE", "PUT": "UPDATE"}.get(method, method)
    return f"{verb} {resource}"


def scrapes_during(cluster: Cluster, cycle: dict[str, Any]) -> int:
    """How many simulator targets Prometheus scraped while the cycle ran. Each target (1,000 GPUs
    here) has its own fixed phase in the scrape interval, and the cycle's phase against them is
    chance: a scrape costs the simulator and Prometheus CPU on the cores the cycle needs."""
    newest = cluster.prom("max by (instance) (timestamp(DCGM_FI_DEV_GPU_UTIL))", at=cycle["t1"])
    return sum(1 for _, value in newest if value >= cycle["t0"])


def interval_cpu(cycles: list[dict[str, Any]]) -> dict[str, float]:
    """Median CPU seconds from one cycle's start to the next's, of the operator and of Prometheus:
    what a whole interval costs, the background refresh and Prometheus' scrapes included."""
    out: dict[str, float] = {}
    for key, name in (
        ("cpu_at", "interval_cpu_s_median"),
        ("prometheus_cpu_at", "interval_prometheus_cpu_s_median"),
    ):
        marks = [c.get(key) for c in cycles]
        steps = [
            b - a
            for a, b in itertools.pairwise(marks)
            if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
        ]
        if steps:
            out[name] = round(statistics.median(steps), 3)
    return out


def in_cycle(records: list[dict[str, Any]], cycle: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in records if cycle["t0"] <= r["t"] <= cycle["t1"]]


def cycle_summary(op: Operator, cycle: dict[str, Any], flipped: set[str] | None = None) -> dict[str, Any]:
    calls = in_cycle(op.calls, cycle)
    queries = [q for q in in_cycle(op.queries, cycle) if not q.get("bg")]
    # the refresh budget's background fetch, started at the cycle's end (before the next cycle)
    after = [q for q in op.queries if q.get("bg") and cycle["t0"] <= q["t"] <= cycle["t1"] + 20]
    verbs = Counter(classify(c) for c in calls)
    patched = [
        f"{m.group(1)}/{m.group(2)}" for c in calls if c["m"] == "PATCH" and (m := _POD_PATH.match(c["p"]))
    ]
    out: dict[str, Any] = {
        "wall_s": cycle["wall"],
        "cpu_s": cycle["cpu"],
        "prometheus_cpu_s": cycle.get("prom_cpu"),
        "phases_s": cycle["phases"],
        "verdicts": cycle["verdicts"],
        "actions": cycle["actions"],
        "writes": cycle["writes"],
        "queries": cycle["queries"],
        "memo": cycle.get("memo", [0, 0, 0]),  # verdicts kept, pods judged, quiet pods not acted on
        "promql": [{k: q[k] for k in ("q", "s", "http", "decode", "bytes", "series", "ok")} for q in queries],
        "background_promql": [
            {k: q[k] for k in ("q", "s", "http", "decode", "bytes", "series", "ok")} for q in after
        ],
        "cpu_at": cycle.get("cpu_at"),
        "prometheus_cpu_at": cycle.get("prom_cpu_at"),
        "api_requests": dict(sorted(verbs.items())),
        "api_writes": sum(n for v, n in verbs.items() if not v.startswith(("GET", "LIST", "WATCH"))),
        "pod_patches": len(patched),
        "pods_patched": len(set(patched)),
        "events_created": verbs.get("CREATE events", 0),
        "status_patches": verbs.get("PATCH gpuefficiencypolicies/status", 0),
        "http_429": sum(1 for c in calls if c["c"] == 429),
        "rss_mib": round(cycle["rss_kib"] / 1024, 1),
        "peak_rss_mib": round(cycle["hwm_kib"] / 1024, 1),
    }
    idle_patches = [
        c for c in calls if c["m"] == "PATCH" and _POD_PATH.match(c["p"]) and IDLE_SINCE in c.get("keys", ())
    ]
    out["pods_patched_to_idle"] = len(idle_patches)  # the idle clock starts: the pod turned Idle
    out["events_by_reason"] = dict(
        Counter(c.get("reason", "?") for c in calls if classify(c) == "CREATE events")
    )
    if flipped is not None:
        out["patched_outside_flipped"] = len(set(patched) - flipped)
    return out


def reclaim_cycle(op: Operator, cycle: dict[str, Any]) -> dict[str, Any]:
    """One Enforce cycle's evictions (per namespace: the budget's other axis) and warnings."""
    calls = in_cycle(op.calls, cycle)
    asked = [c for c in calls if classify(c) == "CREATE pods/eviction"]
    done = [c for c in asked if c["c"] in (200, 201)]
    per_namespace = Counter(m.group(1) for c in done if (m := _POD_PATH.match(c["p"])))
    warned = {
        c["p"]
        for c in calls
        if c["m"] == "PATCH" and _POD_PATH.match(c["p"]) and EVICT_AFTER in c.get("keys", ())
    }
    return {
        "wall_s": cycle["wall"],
        "evictions": len(done),
        "eviction_calls": len(asked),
        "namespaces": len(per_namespace),
        "max_per_namespace": max(per_namespace.values(), default=0),
        "warned": len(warned),
        "writes": cycle["writes"],
        "http_429": sum(1 for c in calls if c["c"] == 429),
    }


def run_reclaim(cluster: Cluster, op: Operator, done_cycles: int, interval_s: int) -> dict[str, Any]:
    """Turn the policy to Enforce (bare pods allowed, short idle and warning periods, small budgets)
    and record every cycle until the hour's budget (or every idle pod) is spent and two more cycles
    evicted nothing: the idle pods are warned, then evicted no faster than the budgets allow."""
    spec = {"mode": "Enforce", "idle": RECLAIM_IDLE, "eviction": {**RECLAIM_BUDGETS, "allowBarePods": True}}
    cluster.kubectl(
        "patch", "gpuefficiencypolicy", POLICY, "--type", "merge", "-p", json.dumps({"spec": spec})
    )
    switched = time.time()
    log(f"policy switched to Enforce: {RECLAIM_BUDGETS}, {RECLAIM_IDLE}")
    cycles: list[dict[str, Any]] = []
    per_cycle, per_hour = RECLAIM_BUDGETS["maxPerCycle"], RECLAIM_BUDGETS["maxPerHour"]
    deadline = time.monotonic() + (per_hour // per_cycle + 8) * (interval_s + 30)
    evicted, quiet = 0, 0
    while time.monotonic() < deadline and quiet < 2:
        op.wait_cycles(done_cycles + 1, deadline - time.monotonic())
        record = op.cycles[done_cycles]
        done_cycles += 1
        if record["t0"] < switched:  # begun before the switch: still Observe
            continue
        summary = reclaim_cycle(op, record)
        cycles.append(summary)
        evicted += summary["evictions"]
        idle = op.gauge("gpu_efficiency_pods", {"policy": POLICY, "verdict": "Idle"}) or 0.0
        spent = evicted >= per_hour or (evicted > 0 and idle == 0)  # the budget, or the idle pods
        quiet = quiet + 1 if spent and summary["evictions"] == 0 else 0
        log(
            f"Enforce cycle: {summary['wall_s']:.2f}s, {summary['evictions']} evicted "
            f"({summary['namespaces']} namespaces, at most {summary['max_per_namespace']} in one), "
            f"{summary['warned']} warned, {evicted} in all"
        )
    counted = json.loads(cluster.kubectl("get", "gpuefficiencypolicy", POLICY, "-o", "json")).get(
        "status", {}
    )
    most = max((c["evictions"] for c in cycles), default=0)
    most_in_namespace = max((c["max_per_namespace"] for c in cycles), default=0)
    return {
        "budgets": RECLAIM_BUDGETS,
        "idle": RECLAIM_IDLE,
        "cycles": cycles,
        "evicted": evicted,
        "warned": sum(c["warned"] for c in cycles),
        "max_per_cycle": most,
        "max_per_namespace_per_cycle": most_in_namespace,
        "within_budgets": most <= per_cycle
        and most_in_namespace <= RECLAIM_BUDGETS["maxPerNamespacePerCycle"]
        and evicted <= per_hour,
        "hour_budget_spent": evicted >= per_hour,
        "status_evictions_total": counted.get("evictionsTotal"),
        "status_evictions_blocked_total": counted.get("evictionsBlockedTotal"),
        "http_429": sum(c["http_429"] for c in cycles),
    }


def apiserver_counts(cluster: Cluster) -> dict[str, float]:
    """Cluster-wide 429s and APF rejections (all clients), to diff around a size's run."""
    totals = {"http_429": 0.0, "apf_rejected": 0.0}
    try:
        text = cluster.apiserver_metrics()
    except OSError as exc:
        log(f"apiserver /metrics unreadable: {exc}")
        return totals
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'code="429"' in line:
            totals["http_429"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_flowcontrol_rejected_requests_total{"):
            totals["apf_rejected"] += float(line.rsplit(" ", 1)[1])
    return totals


# -------------------------------------------------------------------------------------------- sizes --


@dataclass
class Options:
    gpus: int
    steady_cycles: int
    flip_fraction: float
    interval_s: int
    window_s: int
    workers: int
    refresh_budget: int = 0  # the operator's --prometheus-refresh-budget (0: every GPU every cycle)
    reclaim: bool = False  # after the flip, Enforce until the hour's eviction budget is spent (last size)
    #: the other backends (--metrics' second and later): after the steady cycles, an operator against
    #: each in turn on the same pods (its first cycle a restart on annotated pods), then its steady cycles
    others: list[Backend] = field(default_factory=list)
    backend_timeout_s: float = 600.0  # what one other backend's cycles may take in all, per size


def run_size(
    cluster: Cluster, nodes: int, opts: Options, namespaces: list[str], kubeconfig: str, workdir: Path,
    flipped_before: set[str], sim: subprocess.Popen[bytes], last: bool = False,
) -> dict[str, Any]:  # fmt: skip
    started = time.monotonic()
    timings: dict[str, float] = {}
    log(f"=== {nodes} nodes x {opts.gpus} GPUs ===")
    t = time.monotonic()
    add_nodes(cluster, nodes, opts.gpus, opts.workers)
    timings["add_nodes_s"] = time.monotonic() - t
    t = time.monotonic()
    profiles = create_pods(cluster, nodes, opts.gpus, namespaces, opts.workers)
    for key in flipped_before:
        profiles[key] = "idle"
    expected = len(profiles)
    running_at = wait_running(cluster, expected)
    timings["create_pods_s"] = time.monotonic() - t
    t = time.monotonic()
    attributed_at = wait_attributed(cluster, expected, sim)
    # Every pod older than the warm-up (minPodAge = window) and a full window of its own samples.
    ready_at = max(running_at + opts.window_s + 5, attributed_at + opts.window_s + SCRAPE_INTERVAL_S + 5)
    log(
        f"{expected} pods Running and scraped; waiting {max(0.0, ready_at - time.time()):.0f}s for a full window"
    )
    time.sleep(max(0.0, ready_at - time.time()))
    timings["wait_window_s"] = time.monotonic() - t

    before_api = apiserver_counts(cluster)
    t = time.monotonic()
    op = start_operator(cluster, workdir, kubeconfig, f"{nodes}", opts.refresh_budget)
    try:
        cycle_timeout = 600.0
        op.wait_cycles(1 + opts.steady_cycles, cycle_timeout + opts.steady_cycles * (opts.interval_s + 60))
        steady_records = op.cycles[1 : 1 + opts.steady_cycles]
        if opts.refresh_budget > 0:  # the last steady cycle's background refresh, still running
            op.wait_background(steady_records[-1]["t0"], timeout=20.0)
        first = cycle_summary(op, op.cycles[0])
        steady = [cycle_summary(op, c) for c in steady_records]
        for summary, record in zip(steady, steady_records, strict=True):
            summary["targets_scraped_during"] = scrapes_during(cluster, record)
        cpu_steady_proc = op.cpu_seconds()
        status_after_steady = op.proc_status()
        load_after_steady = os.getloadavg()
        timings["steady_s"] = time.monotonic() - t

        # ---- the other backends: one operator at a time, on the same pods -----------------------
        others: dict[str, dict[str, Any]] = {}
        if opts.others:
            stop(op.proc)
        for backend in opts.others:
            t = time.monotonic()
            others[backend.label] = run_backend(cluster, backend, opts, kubeconfig, workdir, nodes)
            timings[f"backend_{backend.label}_s"] = time.monotonic() - t

        # ---- restart: a new process on pods that already carry our annotations -----------------
        t = time.monotonic()
        op, restarted = restart_operator(op, cluster, workdir, kubeconfig, f"{nodes}-restarted", opts)
        timings["restart_s"] = time.monotonic() - t
        log(
            f"restarted: first cycle {restarted['wall_s']:.2f}s, {restarted['api_writes']} writes"
            f" ({restarted['pod_patches']} pod patches, {restarted['events_created']} events)"
        )

        # ---- acting: flip a share of the busy pods to idle -----------------------------------
        t = time.monotonic()
        idle_before = op.gauge("gpu_efficiency_pods", {"policy": POLICY, "verdict": "Idle"}) or 0.0
        busy = sorted(k for k, p in profiles.items() if p not in IDLE_PROFILES)
        count = max(1, round(opts.flip_fraction * expected)) if opts.flip_fraction > 0 else 0
        flipped = set(random.Random(nodes).sample(busy, min(count, len(busy))))
        done_cycles = len(op.cycles)
        flip_t0 = time.time()
        flip_to_idle(cluster, sorted(flipped), opts.workers)
        flip_t1 = time.time()
        log(
            f"flipped {len(flipped)} pods to idle in {flip_t1 - flip_t0:.1f}s; idle verdicts before: {idle_before:.0f}"
        )
        target = idle_before + len(flipped)
        acting: list[dict[str, Any]] = []
        deadline = time.monotonic() + opts.window_s + 4 * opts.interval_s + 240
        idle_now = idle_before
        while flipped and time.monotonic() < deadline:
            op.wait_cycles(done_cycles + 1, deadline - time.monotonic())
            record = op.cycles[done_cycles]
            done_cycles += 1
            idle_now = op.gauge("gpu_efficiency_pods", {"policy": POLICY, "verdict": "Idle"}) or 0.0
            summary = cycle_summary(op, record, flipped)
            summary["started_after_flip_s"] = round(record["t0"] - flip_t1, 1)
            summary["idle_verdicts"] = idle_now
            acting.append(summary)
            log(
                f"cycle after flip: {summary['wall_s']:.2f}s, idle {idle_now:.0f}/{target:.0f}, "
                f"{summary['pod_patches']} pod patches, {summary['events_created']} events"
            )
            if idle_now >= target:
                break
        timings["acting_s"] = time.monotonic() - t
        reclaim: dict[str, Any] | None = None
        if opts.reclaim and last:
            t = time.monotonic()
            try:
                reclaim = run_reclaim(cluster, op, done_cycles, opts.interval_s)
            except (RuntimeError, TimeoutError, subprocess.CalledProcessError, KeyError, ValueError) as exc:
                log(f"the Enforce phase failed: {exc!r}")  # the figures so far are still written
                reclaim = {"error": repr(exc)}
            timings["reclaim_s"] = time.monotonic() - t
        final_status = op.proc_status()
        op.poll()
    finally:
        stop(op.proc)
    after_api = apiserver_counts(cluster)
    became_idle = [c for c in acting if c["events_created"] > 0 or c["pod_patches"] > 0]
    acting_cycle = max(acting, key=lambda c: c["pods_patched_to_idle"]) if acting else None
    walls = [c["wall_s"] for c in steady]
    result = {
        "nodes": nodes,
        "gpus": nodes * opts.gpus,
        "pods": expected,
        "first_cycle": first,
        "restarted_first_cycle": restarted,
        "steady_cycles": steady,
        "steady": {
            "wall_s_median": statistics.median(walls),
            "wall_s_max": max(walls),
            "cpu_s_median": statistics.median(c["cpu_s"] for c in steady),
            "prometheus_cpu_s_median": _median_known(c.get("prometheus_cpu_s") for c in steady),
            "background_queries": sorted({len(c["background_promql"]) for c in steady}),
            "background_s_max": max((q["s"] for c in steady for q in c["background_promql"]), default=0.0),
            **interval_cpu(steady),
            "targets_scraped_during": [c["targets_scraped_during"] for c in steady],
            "queries": sorted({c["queries"] for c in steady}),
            "promql_s_max": max((q["s"] for c in steady for q in c["promql"]), default=0.0),
            "api_requests_per_cycle": steady[-1]["api_requests"],
            "api_writes_total": sum(c["api_writes"] for c in steady),
            "engine_writes_total": sum(c["writes"] for c in steady),
            "rss_mib": round(status_after_steady.get("VmRSS", 0) / 1024, 1),
            "peak_rss_mib": round(status_after_steady.get("VmHWM", 0) / 1024, 1),
            "process_cpu_s_total": round(cpu_steady_proc, 2),
        },
        "acting": {
            "flipped": len(flipped),
            "flip_seconds": round(flip_t1 - flip_t0, 2),
            "idle_verdicts_before": idle_before,
            "idle_verdicts_after": idle_now,
            "all_detected": idle_now >= target,
            "cycles": acting,
            "acting_cycle": acting_cycle,
            "turned_idle": sum(c["pods_patched_to_idle"] for c in acting),
            "idle_events": sum(c["events_by_reason"].get("GPUIdle", 0) for c in acting),
            "acting_cycles": [
                {k: c[k] for k in ("wall_s", "pods_patched_to_idle", "pod_patches", "events_by_reason")}
                for c in acting
                if c["pods_patched_to_idle"]
            ],
            "pod_patches_total": sum(c["pod_patches"] for c in acting),
            "events_total": sum(c["events_created"] for c in acting),
            "cycles_with_writes": len(became_idle),
            "patched_outside_flipped": sum(c["patched_outside_flipped"] for c in acting),
            "http_429_operator": sum(c["http_429"] for c in acting),
        },
        "reclaim": reclaim,
        # the cluster's own backend first (its first cycle after the restart), then the others
        "backends": {
            "primary": backend_figures(
                restarted, steady, status_after_steady, None, load_after_steady, opts.steady_cycles
            ),
            **others,
        },
        "peak_rss_mib": round(final_status.get("VmHWM", 0) / 1024, 1),
        "apiserver": {k: after_api[k] - before_api[k] for k in after_api},
        "operator_429_total": sum(1 for c in op.calls if c["c"] == 429),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "size_seconds": round(time.monotonic() - started, 1),
        "load_avg": os.getloadavg(),
    }
    flipped_before.update(flipped)
    return result


def backend_figures(
    first: dict[str, Any] | None,
    steady: list[dict[str, Any]],
    status: dict[str, int],
    error: str | None,
    load: tuple[float, float, float],
    expected_steady: int,
) -> dict[str, Any]:
    """One backend's figures at one size, for the side-by-side table: its steady cycles' medians
    and its first cycle after a restart on pods that carry the operator's annotations."""

    def med(values: Iterable[float | None]) -> float:
        return _median_known(values)

    reads = [
        sum(n for v, n in c["api_requests"].items() if v.startswith(("GET", "LIST", "WATCH"))) for c in steady
    ]
    return {
        "error": error,
        "steady_cycles_done": f"{len(steady)}/{expected_steady}",
        "wall_s": [c["wall_s"] for c in steady],
        "wall_s_median": med(c["wall_s"] for c in steady),
        "slowest_query_s_median": med(max((q["s"] for q in c["promql"]), default=None) for c in steady),
        "queries": sorted({c["queries"] for c in steady}),
        "failed_queries": sum(1 for c in steady for q in c["promql"] if not q["ok"]),
        "backend_cpu_s_median": med(c.get("prometheus_cpu_s") for c in steady),
        "operator_cpu_s_median": med(c["cpu_s"] for c in steady),
        "verdicts": [c["verdicts"] for c in steady],
        "api_reads": reads,
        "api_writes": [c["api_writes"] for c in steady],
        "rss_mib": round(status.get("VmRSS", 0) / 1024, 1),
        "peak_rss_mib": round(status.get("VmHWM", 0) / 1024, 1),
        "first_cycle_s": first["wall_s"] if first else None,
        "first_cycle_writes": first["api_writes"] if first else None,
        "first_cycle_pod_patches": first["pod_patches"] if first else None,
        "first_cycle_failed_queries": sum(1 for q in first["promql"] if not q["ok"]) if first else None,
        "load_avg": load,
    }


def run_backend(
    cluster: Cluster, backend: Backend, opts: Options, kubeconfig: str, workdir: Path, nodes: int
) -> dict[str, Any]:
    """The operator against another backend on the same pods (the cluster's own backend's operator
    stopped): its first cycle is a restart on annotated pods, then --steady-cycles cycles. A backend
    too slow for --backend-timeout keeps the cycles it finished and says so."""
    log(f"--- {nodes} nodes against {backend.label} ({backend.url}) ---")
    op = start_operator(
        cluster, workdir, kubeconfig, f"{nodes}-{backend.label}", backend.refresh_budget, backend
    )
    error = None
    status: dict[str, int] = {}
    try:
        try:
            op.wait_cycles(1 + opts.steady_cycles, opts.backend_timeout_s)
        except RuntimeError as exc:
            error = str(exc)
            log(f"{backend.label}: {error}")
        if op.proc.poll() is None:
            status = op.proc_status()
        op.poll()
    finally:
        stop(op.proc)
    first = cycle_summary(op, op.cycles[0]) if op.cycles else None
    steady = [cycle_summary(op, c) for c in op.cycles[1 : 1 + opts.steady_cycles]]
    figures = backend_figures(first, steady, status, error, os.getloadavg(), opts.steady_cycles)
    log(
        f"{backend.label}: first cycle {figures['first_cycle_s']}s ({figures['first_cycle_writes']} writes),"
        f" steady {figures['wall_s']}, reads {figures['api_reads']}, writes {figures['api_writes']}"
    )
    return figures


# ------------------------------------------------------------------------------------------ output --


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }


def _median_known(values: Iterable[float | None]) -> float:
    """The median of the values that were measured (NaN: none was)."""
    known = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def _reclaimed(result: dict[str, Any]) -> bool:
    """Did this size run the --reclaim phase to its end?"""
    return bool(result.get("reclaim")) and "error" not in result["reclaim"]


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("nodes / GPUs / pods", lambda r: f"{r['nodes']} / {r['gpus']} / {r['pods']}"),
        ("steady wall s (median, max)", lambda r: f"{r['steady']['wall_s_median']:.2f}, {r['steady']['wall_s_max']:.2f}"),
        ("steady CPU s (median)", lambda r: f"{r['steady']['cpu_s_median']:.2f}"),
        ("Prometheus CPU s per steady cycle (median)", lambda r: f"{r['steady'].get('prometheus_cpu_s_median', math.nan):.2f}"),
        ("observe s: pods LIST | Prometheus", lambda r: "{:.2f}: {:.2f} | {:.2f}".format(
            *(statistics.median(c["phases_s"].get(p, 0.0) for c in r["steady_cycles"])
              for p in ("observe", "read_pods", "fetch")))),
        ("plan s", lambda r: f"{statistics.median(c['phases_s'].get('plan', 0.0) for c in r['steady_cycles']):.2f}"),
        ("plan: verdicts kept / judged / quiet pods (median)", lambda r: " / ".join(
            str(int(statistics.median(c.get("memo", [0, 0, 0])[i] for c in r["steady_cycles"])))
            for i in range(3))),
        ("PromQL queries per cycle", lambda r: ",".join(str(q) for q in r["steady"]["queries"])),
        ("background refresh after a cycle: queries, slowest s", lambda r: ",".join(
            str(q) for q in r["steady"]["background_queries"]) + f"; {r['steady']['background_s_max']:.2f}"),
        ("simulator targets scraped during each steady cycle", lambda r: ",".join(
            str(n) for n in r["steady"]["targets_scraped_during"])),
        ("CPU s per interval, operator / Prometheus (median)", lambda r: (
            f"{r['steady'].get('interval_cpu_s_median', math.nan):.2f} / "
            f"{r['steady'].get('interval_prometheus_cpu_s_median', math.nan):.2f}")),
        ("slowest PromQL query s (answer+read)", lambda r: f"{r['steady']['promql_s_max']:.2f}"),
        ("API requests per steady cycle", lambda r: ", ".join(
            f"{k} {v}" for k, v in r["steady"]["api_requests_per_cycle"].items())),
        ("steady API writes (all cycles)", lambda r: str(r["steady"]["api_writes_total"])),
        ("peak RSS MiB (steady / run)", lambda r: f"{r['steady']['peak_rss_mib']:.0f} / {r['peak_rss_mib']:.0f}"),
        ("first cycle: wall s, writes", lambda r: f"{r['first_cycle']['wall_s']:.1f}, {r['first_cycle']['api_writes']}"),
        ("restarted first cycle: wall s, writes (pod patches, events)", lambda r: "{:.1f}, {} ({}, {})".format(
            r["restarted_first_cycle"]["wall_s"], r["restarted_first_cycle"]["api_writes"],
            r["restarted_first_cycle"]["pod_patches"], r["restarted_first_cycle"]["events_created"])),
        ("flipped to idle", lambda r: str(r["acting"]["flipped"])),
        ("acting cycle wall s", lambda r: f"{r['acting']['acting_cycle']['wall_s']:.2f}" if r["acting"]["acting_cycle"] else "-"),
        ("turned Idle: patches / GPUIdle events", lambda r: "{} / {} in {} cycle(s)".format(
            r["acting"]["turned_idle"], r["acting"]["idle_events"], len(r["acting"]["acting_cycles"]))),
        ("after flip: patches/events (all)", lambda r: f"{r['acting']['pod_patches_total']} / {r['acting']['events_total']} in {len(r['acting']['cycles'])} cycles"),
        ("all flipped pods Idle", lambda r: str(r["acting"]["all_detected"])),
        ("Enforce: evicted (warned) in cycles; budgets kept", lambda r: "{} ({}) in {}; {}".format(
            r["reclaim"]["evicted"], r["reclaim"]["warned"], len(r["reclaim"]["cycles"]),
            r["reclaim"]["within_budgets"]) if _reclaimed(r) else "-"),
        ("Enforce: most a cycle / in a namespace a cycle", lambda r: "{} / {}".format(
            r["reclaim"]["max_per_cycle"], r["reclaim"]["max_per_namespace_per_cycle"])
            if _reclaimed(r) else "-"),
        ("429s (operator / apiserver)", lambda r: f"{r['operator_429_total']} / {r['apiserver']['http_429']:.0f}"),
        ("size wall time s", lambda r: f"{r['size_seconds']:.0f}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    cols = [[fmt(r) for r in results] for _, fmt in rows]
    colw = [max(len(c[i]) for c in cols) for i in range(len(results))]
    lines = []
    for (name, _), values in zip(rows, cols, strict=True):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, colw, strict=True)))
    return "\n".join(lines)


def backends_table(result: dict[str, Any], primary: str) -> str:
    """One size's backends side by side, each figure also as a ratio to the cluster's own backend."""
    figures = result["backends"]
    base = figures["primary"]
    labels = [primary, *(k for k in figures if k != "primary")]
    cols = [figures["primary"], *(v for k, v in figures.items() if k != "primary")]

    def num(value: float | None, ref: float | None, digits: int = 2) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if ref and not math.isnan(ref) and ref > 0:
            return f"{value:.{digits}f} ({value / ref:.1f}x)"
        return f"{value:.{digits}f}"

    rows = [
        ("steady cycles done", lambda f: f["steady_cycles_done"] + (" (error)" if f["error"] else "")),
        ("steady wall s, median", lambda f: num(f["wall_s_median"], base["wall_s_median"])),
        ("steady wall s, each", lambda f: ", ".join(f"{w:.2f}" for w in f["wall_s"]) or "-"),
        ("slowest query s, median", lambda f: num(f["slowest_query_s_median"], base["slowest_query_s_median"])),
        ("queries per cycle; failed", lambda f: ",".join(map(str, f["queries"])) + f"; {f['failed_queries']}"),
        ("backend CPU s per cycle", lambda f: num(f["backend_cpu_s_median"], base["backend_cpu_s_median"])),
        ("operator CPU s per cycle", lambda f: num(f["operator_cpu_s_median"], base["operator_cpu_s_median"])),
        ("operator RSS / peak MiB", lambda f: f"{f['rss_mib']:.0f} / {f['peak_rss_mib']:.0f}"),
        ("API reads per steady cycle", lambda f: ",".join(map(str, f["api_reads"])) or "-"),
        ("API writes per steady cycle", lambda f: ",".join(map(str, f["api_writes"])) or "-"),
        ("first cycle after a restart s (writes)", lambda f: (
            f"{num(f['first_cycle_s'], base['first_cycle_s'], 1)} ({f['first_cycle_writes']})")),
        ("load average 1/5/15 after", lambda f: "/".join(f"{x:.1f}" for x in f["load_avg"])),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    cells = [[fmt(c) for c in cols] for _, fmt in rows]
    colw = [max(len(labels[i]), *(len(r[i]) for r in cells)) for i in range(len(cols))]
    lines = [
        f"{result['nodes']} nodes".ljust(width)
        + "  "
        + "  ".join(label.rjust(w) for label, w in zip(labels, colw, strict=True))
    ]
    for (name, _), values in zip(rows, cells, strict=True):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(values, colw, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="100,300,1000", help="comma list of cluster sizes (cumulative)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--steady-cycles", type=int, default=3)
    parser.add_argument("--flip-fraction", type=float, default=0.05)
    parser.add_argument("--mode", choices=("Observe", "Enforce"), default="Observe")
    parser.add_argument("--interval", default="30s")
    parser.add_argument("--window", default="2m")
    parser.add_argument("--query-timeout", default="60s", help="the policy's metrics.prometheus.queryTimeout")
    parser.add_argument("--sim-targets", type=int, default=8)
    parser.add_argument(
        "--sim-port",
        type=int,
        default=int(os.environ.get("GPUEFF_SCALE_SIM_PORT", "61400")),
        help="first simulator port (target i: port+i; 0: free ports, a new set of series per run); the"
        " default is above Linux's ephemeral range (32768-60999), where a client connection may hold it",
    )
    parser.add_argument(
        "--sim-render",
        type=float,
        default=float(SCRAPE_INTERVAL_S),
        metavar="SECONDS",
        help="the simulator renders every GPU's metrics this often (default: once per scrape interval, as an"
        " exporter collects once per scrape or less; before 2026-12-08 every 5 s, 3 renders per scrape)",
    )
    parser.add_argument(
        "--sim-node-poll",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="the simulator lists the nodes this often to find new ones (before 2026-12-08: every 5 s)",
    )
    parser.add_argument("--workers", type=int, default=16, help="concurrent API calls when creating pods")
    parser.add_argument("--reuse", action="store_true", help="keep an existing scale cluster's objects")
    parser.add_argument(
        "--refresh-budget", type=int, default=0, help="the operator's --prometheus-refresh-budget (0: off)"
    )
    parser.add_argument(
        "--reclaim",
        action="store_true",
        help="at the last size, after the flip: turn the policy to Enforce (bare pods allowed, idleFor 1m,"
        f" warningPeriod 30s, {RECLAIM_BUDGETS}) and record evictions per cycle and namespace until"
        " the hour's budget is spent",
    )
    parser.add_argument(
        "--metrics",
        default="prometheus",
        help="the metrics backend (cluster.sh up --metrics: prometheus, victoriametrics or"
        " victoriametrics-cluster), scraping the same targets every 15 s; the operator queries it at its"
        " Prometheus API URL. A comma list runs the others beside the first (cluster.sh *-up) and, at"
        " each size after the first's steady cycles, an operator against each in turn on the same pods;"
        " name@budget sets that operator's refresh budget (else --refresh-budget); every query fits"
        " VictoriaMetrics' 16 KiB -search.maxQueryLen at any budget",
    )
    parser.add_argument(
        "--backend-timeout",
        type=float,
        default=600.0,
        help="seconds the first and steady cycles against each other backend may take, per size",
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster up afterwards")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    # Stop cleanly (operator, simulator, cluster) on SIGTERM, and on SIGINT even when started in the
    # background (where SIGINT is inherited as ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    from gpu_efficiency.api.durations import parse_duration

    sizes = [int(n) for n in args.nodes.split(",")]
    if sizes != sorted(sizes):
        raise SystemExit("--nodes must grow: sizes are reached by adding nodes and pods")
    backends = parse_backends(args.metrics, args.refresh_budget)
    opts = Options(
        gpus=args.gpus_per_node,
        steady_cycles=args.steady_cycles,
        flip_fraction=args.flip_fraction,
        interval_s=int(parse_duration(args.interval)),
        window_s=int(parse_duration(args.window)),
        workers=args.workers,
        refresh_budget=backends[0].refresh_budget,
        reclaim=args.reclaim,
        backend_timeout_s=args.backend_timeout,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = args.out / f"scale-{stamp}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    info = machine()
    env = cluster_env()
    cluster = cluster_up(env, args.reuse, backends[0].name)
    for name in dict.fromkeys(b.name for b in backends[1:] if b.name != backends[0].name):
        start_beside(env, name)
    opts.others = [backend_urls(env, b) for b in backends[1:]]
    sim = None
    results: list[dict[str, Any]] = []
    try:
        kubeconfig = install_crd_and_rbac(cluster, workdir)
        namespaces = create_namespaces(cluster, args.namespaces)
        apply_policy(cluster, args.mode, args.interval, args.window, args.query_timeout)
        sim = start_simulator(
            cluster, workdir, args.sim_targets, args.sim_port, args.sim_render, args.sim_node_poll
        )
        flipped: set[str] = set()
        for nodes in sizes:
            last = nodes == sizes[-1]
            results.append(
                run_size(cluster, nodes, opts, namespaces, kubeconfig, workdir, flipped, sim, last)
            )
            print(table(results[-1:]), flush=True)
            if opts.others:
                print(backends_table(results[-1], backends[0].label), flush=True)
    finally:
        stop(sim)
        if not args.keep_cluster:
            subprocess.run([str(CLUSTER_SH), "down", "--purge"], env=env, capture_output=True, text=True)
            log("scale cluster torn down (purged)")
    doc = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "timestamp": stamp,
        "machine": info,
        "policy": {
            "mode": args.mode,
            "interval": args.interval,
            "window": args.window,
            "scrapeInterval": f"{SCRAPE_INTERVAL_S}s",
            "refreshBudget": args.refresh_budget,
        },
        "metrics": args.metrics,
        "simulator": {"renderSeconds": args.sim_render, "nodePollSeconds": args.sim_node_poll},
        "profile_mix": dict(PROFILE_MIX),
        "results": results,
        "total_seconds": round(time.monotonic() - started, 1),
        "workdir": str(workdir),
    }
    path = args.out / f"scale-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2))
    print()
    print(table(results))
    for result in results if opts.others else ():
        print()
        print(backends_table(result, backends[0].label))
    print(f"\ntotal {doc['total_seconds']:.0f}s; JSON: {path}; traces and logs: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
