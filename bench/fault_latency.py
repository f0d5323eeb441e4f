"""Fault-to-taint latency: from an injected GPU fault to the operator's taint on the API server.

    python bench/fault_latency.py [--runs 60] [--interval 5s] [--scrape-interval 1s] [--keep-cluster]
                                  [--path node|dra|agent] [--agent-nodes 3] [--no-early-cycles]
                                  [--metrics prometheus|victoriametrics|victoriametrics-cluster]
                                  [--vm-latency-offset 2s]

Two paths: ``node`` (default) injects an ECC double-bit error and times the node taint; ``dra``
publishes every node's GPUs in a ResourceSlice (driver gpu.nvidia.com, as NVIDIA's DRA driver
would), injects a reset-class XID (48, 62 on a GPU's second visit) and times the operator's
DeviceTaintRule for that one device (a raw watch of DeviceTaintRules, as for nodes); its recovery
is ``fault-recovered=xid`` and the rule's deletion. Needs DeviceTaintRules served (cluster.sh's
default GPUEFF_RUNTIME_CONFIG and GPUEFF_FEATURE_GATES).

``agent`` runs the node agent as real processes (``gpu-efficiency-sim agent``, fake NVML, 1 s samples,
``--write-node-condition``) on the first --agent-nodes KWOK nodes, which the simulator then leaves
out (Prometheus holds no series for them: only the agents can report their faults), and the policy
reads the agents (``metrics.nodeAgent``, the operator's ``--agent-urls``). A run drops a critical XID
(79, each GPU once) as an NVML event into the agent's ``--fake-inbox``; the agent writes
``GPUHealthy=False``, the operator's node watch wakes an early cycle (runtime/fault_wake.py), and that
cycle reads the XID from the agents' snapshots. ``t_sample`` is then the agent's receipt of the event
(its /snapshot ``events``). ``--no-early-cycles`` starts the operator with ``--fault-wake-min-gap 0``:
the agents are read at the next regular cycle only.

The operator reads faults from Prometheus, so a fault waits for the next scrape (at most the scrape
interval), then for the next evaluation cycle (at most the policy's interval), then for the cycle's
own work. ``scrape interval + evaluation interval`` is the floor of the worst case on this path;
this bench measures the real distribution against it.

``--metrics`` puts another PromQL backend in Prometheus' place (``cluster.sh up --metrics``: the
same scrape config and file-SD targets): VictoriaMetrics single-node, or its cluster version
(vmagent -> vminsert -> two vmstorage <- vmselect; needs ``GPUEFF_VM_CLUSTER_BIN``). Both hide the
newest ``-search.latencyOffset`` of data from queries: the local cluster sets 2s,
``--vm-latency-offset 30s`` is VictoriaMetrics' default. On those paths the floor above grows by
the offset; ``t_sample`` stays the sample's own timestamp, so sample -> taint includes it.

Set-up (bench/scale/run.py's helpers): a local cluster of its own (hack/localcluster/cluster.sh with
GPUEFF_STATE_DIR /tmp/gpueff-faultbench and the 42xxx ports unless set; Prometheus scraping every
--scrape-interval), --nodes KWOK GPU nodes, the CRD and the chart's RBAC, the operator as a real
process (``gpu-efficiency run``) with a ServiceAccount token, and one Enforce policy (ECC recovery
Manual, the default circuit breaker of 20 %).

The DCGM simulator runs inside this process (gpu_efficiency_sim's Simulator and MetricsServer,
registered with Prometheus through file service discovery), rendering on every scrape, so the bench
knows the instant the served value changes. Per run:

1. Pick the next node (round robin) and its next GPU (beyond 8 visits a GPU comes again: a new
   increment after a recovery is a new fault); wait until the node carries none of our taints.
   The previous taint came just after a cycle started, so wait 0.5 s plus a uniform share of one
   measured cycle period after it: the injection falls at a uniformly random phase of the
   operator's cycle (and of the scrape).
2. t_inject: add an ECC double-bit error (volatile DBE counter +1) at the simulator's now.
3. t_taint: the receipt time of the node watch event (a raw watch on the API server, timestamped
   as its line arrives) in which ``gpuefficiency.io/gpu-fault`` first names ``ecc``; the taint's
   ``timeAdded`` (whole seconds) is kept too.
4. t_sample: the Prometheus timestamp of the first sample carrying the new value (from a range
   selector, which returns sample timestamps exactly).
5. The admin's manual recovery: annotate the node ``gpuefficiency.io/fault-recovered=ecc``; the
   untaint is timed as well. The next run uses another node, so recoveries overlap with the next
   injection (at most 2 of the 10 nodes tainted at once: within the default breaker).

The operator's cycles (start and duration, from its JSON log) split sample->taint into the wait for
the cycle and the cycle's own work, and show any cycle that started after the sample without
acting on it. Prints a per-run table and the aggregates (median, p90, p99, max) against the floor;
writes bench/results/fault-latency-<timestamp>.json (operator log alongside). No timed assertions:
it exits non-zero only when a run never taints (or the set-up fails).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from kubernetes import client

from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.names import FAULT_RECOVERED, FAULT_TAINT_KEY
from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.gpu_models import find_model
from gpu_efficiency_sim.server import MetricsServer
from gpu_efficiency_sim.simulator import SimNode, Simulator
from gpu_efficiency_sim.targets import DEFAULT_JOB, register, unregister
from scale.run import OPERATOR_NAMESPACE, Cluster, install_crd_and_rbac, machine, running_cluster

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "hack" / "localcluster" / "cluster.sh"

BENCH_ENV = {
    "GPUEFF_STATE_DIR": "/tmp/gpueff-faultbench",
    "GPUEFF_ETCD_PORT": "42379",
    "GPUEFF_ETCD_PEER_PORT": "42380",
    "GPUEFF_APISERVER_PORT": "42443",
    "GPUEFF_KCM_PORT": "42257",
    "GPUEFF_SCHEDULER_PORT": "42259",
    "GPUEFF_KWOK_PORT": "42247",
    "GPUEFF_PROM_PORT": "42090",
    "GPUEFF_VM_PORT": "42428",
    "GPUEFF_VMAGENT_PORT": "42429",
    "GPUEFF_VMINSERT_PORT": "42480",
    "GPUEFF_VMSELECT_PORT": "42481",
    "GPUEFF_VMSTORAGE_PORT_BASE": "42500",  # vmstorage N: 42500+10N .. +2
}
POLICY = "fault-latency"
SIM_NAME = "faultbench"
DBE = str(Signal.ECC_DBE_VOLATILE)
XID = str(Signal.XID)
#: Reset-class XIDs (single-GPU quarantine on the dra path): a GPU's n-th visit injects the n-th,
#: so the XID gauge changes on every visit.
RESET_XIDS = (48, 62)
#: The agent path's XID: GPU fell off the bus (reboot class; in the agent's default critical list).
AGENT_XID = 79
DRA_DRIVER = "gpu.nvidia.com"
RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")
OURS = "app.kubernetes.io/managed-by=gpu-efficiency-operator"


def log(message: str) -> None:
    print(f"[fault-latency {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ cluster --


def cluster_env(scrape: str, vm_latency_offset: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in BENCH_ENV.items():
        env.setdefault(key, value)
    env["GPUEFF_PROM_SCRAPE_INTERVAL"] = scrape
    if vm_latency_offset is not None:
        env["GPUEFF_VM_LATENCY_OFFSET"] = vm_latency_offset
    env.setdefault("GPUEFF_PYTHON", sys.executable)  # cluster.sh builds its GPU nodes with the harness
    if env["GPUEFF_STATE_DIR"].rstrip("/") == "/tmp/gpueff-localcluster":
        raise SystemExit("refusing to use the default local cluster's state dir: set GPUEFF_STATE_DIR")
    return env


def cluster_up(env: dict[str, str], nodes: int, scrape: str, metrics: str = "prometheus") -> Cluster:
    """A fresh cluster in the bench's state dir (a previous one there is purged first)."""
    state = Path(env["GPUEFF_STATE_DIR"])
    if (state / "etcd").exists():
        log(f"purging the previous bench cluster in {state}")
        subprocess.run(
            [str(CLUSTER_SH), "down", "--purge"], env=env, capture_output=True, text=True, check=True
        )
    t0 = time.monotonic()
    up = subprocess.run(
        [str(CLUSTER_SH), "up", "--nodes", str(nodes), "--metrics", metrics],
        env=env,
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        raise SystemExit(f"cluster.sh up failed:\n{up.stderr[-4000:]}")
    if f"scrape_interval: {scrape}" not in (state / "prometheus" / "prometheus.yml").read_text():
        raise SystemExit(f"Prometheus in {state} does not scrape every {scrape}")
    log(f"cluster up in {time.monotonic() - t0:.0f}s ({state}, {nodes} GPU nodes, {metrics})")
    return running_cluster(env, state)


def apply_policy(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    policy = {
        "apiVersion": "gpuefficiency.io/v1alpha1",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "mode": "Enforce",
            "interval": args.interval,
            "window": args.window or f"{max(60, math.ceil(parse_duration(args.interval)))}s",
            "metrics": {
                "prometheus": {"scrapeInterval": args.scrape_interval},
                "nodeAgent": args.path == "agent",
            },
            "faults": {
                "lookback": args.lookback,
                "ecc": {"enabled": True, "effect": "NoSchedule", "recovery": "Manual"},
                "xid": {"enabled": True, "recovery": "Manual"},
                "deviceQuarantine": {"enabled": True, "effect": "NoSchedule"},
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input_=yaml.safe_dump(policy))
    return policy


def prom_get(cluster: Cluster, path: str, params: dict[str, str]) -> Any:
    """The ``data`` of a query answering a matrix (a range-vector selector's raw samples), which
    the operator's client (``cluster.prom``: instant vectors only) does not decode."""
    url = f"{cluster.prometheus_url}{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        return orjson.loads(response.read())["data"]


# ----------------------------------------------------------------------------------------- watches --


@dataclass(frozen=True)
class NodeState:
    kinds: frozenset[str]  # kinds our taint names (any effect)
    time_added: str  # timeAdded of our taint naming ecc ('' if none)
    recovery_requested: bool  # the fault-recovered annotation is present


def node_state(obj: dict[str, Any]) -> NodeState:
    kinds: set[str] = set()
    added = ""
    for taint in (obj.get("spec") or {}).get("taints") or ():
        if taint.get("key") == FAULT_TAINT_KEY:
            named = {k for k in str(taint.get("value", "")).split(".") if k}
            kinds |= named
            if "ecc" in named:
                added = str(taint.get("timeAdded", ""))
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return NodeState(frozenset(kinds), added, FAULT_RECOVERED in annotations)


@dataclass(frozen=True)
class Transition:
    t: float  # receipt time (epoch seconds)
    node: str
    before: NodeState
    after: NodeState


class NodeWatch:
    """A raw watch of the nodes; every change of our taints or the recovery annotation, timestamped
    as its line arrives (before any decoding but the line's JSON)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.states: dict[str, NodeState] = {}
        self.transitions: list[Transition] = []
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._response: Any = None
        self._rv = ""
        self.error: str = ""
        self._thread = threading.Thread(target=self._loop, name="node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self._list()
        self._thread.start()
        return self

    def _request(self, **kwargs: Any) -> Any:
        return self.core.list_node(_preload_content=False, **kwargs)

    def _keyed(self, obj: dict[str, Any], deleted: bool) -> tuple[str, NodeState]:
        """The node an object is about, and its state after the event."""
        return obj["metadata"]["name"], NodeState(frozenset(), "", False) if deleted else node_state(obj)

    def _list(self) -> None:
        body = orjson.loads(self._request().data)
        with self.cond:
            for item in body.get("items") or ():
                key, state = self._keyed(item, False)
                self.states[key] = state
        self._rv = body["metadata"]["resourceVersion"]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception as exc:  # re-list and watch again; kept for the report if it persists
                if self._stop.is_set():
                    return
                self.error = f"{type(exc).__name__}: {exc}"
                time.sleep(0.2)
                try:
                    self._list()
                except Exception as again:
                    self.error = f"{type(again).__name__}: {again}"

    def _watch(self) -> None:
        response = self._request(
            watch=True, resource_version=self._rv, allow_watch_bookmarks=True, timeout_seconds=120
        )
        self._response = response
        buffer = b""
        try:
            for segment in response.stream(amt=None, decode_content=False):
                received = time.time()
                buffer += segment
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._event(orjson.loads(line), received)
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def _event(self, event: dict[str, Any], received: float) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._rv = rv
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name, after = self._keyed(obj, kind == "DELETED")
        with self.cond:
            before = self.states.get(name, NodeState(frozenset(), "", False))
            self.states[name] = after
            if after != before:
                self.transitions.append(Transition(received, name, before, after))
                self.cond.notify_all()

    def mark(self) -> int:
        """How many transitions were seen so far (to wait for later ones)."""
        with self.cond:
            return len(self.transitions)

    def wait_kind(
        self, node: str, kind: str, *, present: bool, since: int, timeout: float
    ) -> tuple[int, Transition] | None:
        """The first transition of ``node`` after ``since`` in which our taint starts (``present``)
        or stops naming ``kind``, with its index; None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(since, len(self.transitions)):
                    t = self.transitions[i]
                    if (
                        t.node == node
                        and (kind in t.after.kinds) == present
                        and (kind in t.before.kinds) != present
                    ):
                        return i, t
                since = len(self.transitions)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))

    def wait_clean(self, node: str, timeout: float) -> bool:
        """Until ``node`` carries none of our taints and no pending recovery request."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                state = self.states.get(node)
                if state is not None and not state.kinds and not state.recovery_requested:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # urllib3 >= 2.3: unblocks the reading thread
            except Exception:
                response.close()
        self._thread.join(timeout=5)


class RuleWatch(NodeWatch):
    """Our DeviceTaintRules, watched the same way, as the state of the node each is on (its kinds;
    one rule per node at a time here). A node without a rule is clean."""

    def __init__(self, custom: client.CustomObjectsApi) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.custom = custom

    def _request(self, **kwargs: Any) -> Any:
        return self.custom.list_cluster_custom_object(
            *RULES, label_selector=OURS, _preload_content=False, **kwargs
        )

    def _keyed(self, obj: dict[str, Any], deleted: bool) -> tuple[str, NodeState]:
        meta = obj.get("metadata") or {}
        node = str((meta.get("annotations") or {}).get("gpuefficiency.io/node", ""))
        kind = str((meta.get("labels") or {}).get("gpuefficiency.io/fault-kind", ""))
        return node, NodeState(frozenset() if deleted else frozenset({kind}), "", False)

    def wait_clean(self, node: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while (state := self.states.get(node)) is not None and state.kinds:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
            return True


def publish_slices(cluster: Cluster, sim: Simulator, nodes: list[SimNode]) -> None:
    """Every node's GPUs as DRA devices: pool = node, device gpu-<index>, the simulator's UUIDs."""
    custom: Any = client.CustomObjectsApi(cluster.core.api_client)
    for node in nodes:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node.name}-gpus"},
            "spec": {
                "driver": DRA_DRIVER,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": f"gpu-{i}", "attributes": {"uuid": {"string": sim.uuid_of(node.name, i)}}}
                    for i in range(node.gpus)
                ],
            },
        }
        custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)


# -------------------------------------------------------------------------------------- the operator --


@dataclass(frozen=True)
class Cycle:
    start: float  # epoch seconds (log time minus the cycle's duration)
    seconds: float
    writes: int


class OperatorProcess:
    def __init__(
        self, cluster: Cluster, kubeconfig: str, log_path: Path, extra: tuple[str, ...] = ()
    ) -> None:
        env = {**cluster.env, "KUBECONFIG": kubeconfig, "PYTHONUNBUFFERED": "1"}
        self.log_path = log_path
        with log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "gpu_efficiency.cli", "run",
                    "--prometheus-url", cluster.prometheus_url, "--namespace", OPERATOR_NAMESPACE,
                    "--no-leader-election", "--metrics-port", "0", "--health-port", "0",
                    "--log-format", "json", *extra,
                ],
                stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self._offset = 0
        self.cycles: list[Cycle] = []

    def poll(self) -> list[Cycle]:
        """Cycles logged so far ("policy P: cycle 0.12s, ... N writes, ...")."""
        with self.log_path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        prefix = f"policy {POLICY}: cycle "
        for line in data[:end].splitlines():
            if not line.startswith(b"{"):
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            message = str(record.get("message", ""))
            if not message.startswith(prefix):
                continue
            parts = message.removeprefix(prefix).split(", ")
            seconds = float(parts[0].rstrip("s"))
            writes = next((int(p.split()[0]) for p in parts if p.endswith(" writes")), 0)
            logged = datetime.fromisoformat(str(record["timestamp"])).timestamp()
            self.cycles.append(Cycle(start=logged - seconds, seconds=seconds, writes=writes))
        return self.cycles

    def period(self, default: float) -> float:
        """Median time between the last cycle starts (the real period: interval + cycle + tick)."""
        starts = [c.start for c in self.poll()[-12:]]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        return statistics.median(gaps) if len(gaps) >= 3 else default

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# -------------------------------------------------------------------------------------------- runs --


@dataclass
class Run:
    index: int
    warmup: bool
    node: str
    gpu: int
    delay_s: float  # after the previous taint
    load_avg_1m: float = math.nan
    value: int = 0  # the DBE counter served from t_inject on
    t_inject: float | None = None  # epoch seconds, like every t_*
    t_taint: float | None = None  # receipt of the watch event
    time_added: str = ""  # the taint's timeAdded (whole seconds)
    code: int = 0  # dra path: the XID injected
    t_sample: float | None = None  # Prometheus' timestamp of the first sample at ``value``
    t_sample_before: float | None = None  # the last sample still at the old value
    t_recover_requested: float | None = None
    t_untaint: float | None = None
    cycle_start: float | None = None  # the cycle that tainted
    cycle_seconds: float | None = None
    cycles_missed: int = 0  # cycles started after t_sample that did not taint
    phase: float | None = None  # of t_inject in its cycle period (0: when a cycle starts)
    derived: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{'w' if self.warmup else ''}{self.index}"


def first_sample(
    cluster: Cluster, node: str, gpu: int, value: int, t_inject: float, metric: str = DBE
) -> tuple[float, float] | None:
    """(timestamp of the first sample at ``value`` at or after the injection, of the one before)."""
    series = f'{metric}{{simulator="{SIM_NAME}", Hostname="{node}", gpu="{gpu}"}}'
    span = max(10, math.ceil(time.time() - t_inject) + 10)
    data = prom_get(cluster, "/api/v1/query", {"query": f"{series}[{span}s]", "time": f"{time.time():.3f}"})
    points = [(float(ts), float(v)) for ts, v in data["result"][0]["values"]] if data["result"] else []
    before = None
    for ts, v in points:
        if (v == value if metric == XID else v >= value) and ts >= t_inject - 2.0:
            return ts, before if before is not None else math.nan
        before = ts
    return None


def decompose(run: Run, cycles: list[Cycle]) -> None:
    """Which cycle tainted, how long the sample waited for it, cycles that missed it, the phase."""
    if run.t_taint is None or run.t_inject is None:
        return
    starts = [c.start for c in cycles]
    i = bisect.bisect_right(starts, run.t_taint) - 1
    if i >= 0:
        run.cycle_start, run.cycle_seconds = cycles[i].start, cycles[i].seconds
        if run.t_sample is not None:
            run.cycles_missed = sum(1 for c in cycles[:i] if c.start > run.t_sample)
    # Phase of the injection: between the cycle starts around it.
    j = bisect.bisect_right(starts, run.t_inject) - 1
    if 0 <= j < len(cycles) - 1:
        run.phase = (run.t_inject - starts[j]) / (starts[j + 1] - starts[j])
    d: dict[str, float] = {"inject_to_taint_s": run.t_taint - run.t_inject}
    if run.t_sample is not None:
        d["inject_to_sample_s"] = run.t_sample - run.t_inject
        d["sample_to_taint_s"] = run.t_taint - run.t_sample
        if run.cycle_start is not None:
            d["sample_to_cycle_start_s"] = run.cycle_start - run.t_sample
    if run.cycle_start is not None:
        d["cycle_start_to_taint_s"] = run.t_taint - run.cycle_start
    if run.t_untaint is not None and run.t_recover_requested is not None:
        d["recovery_to_untaint_s"] = run.t_untaint - run.t_recover_requested
    if run.time_added:
        added = datetime.fromisoformat(run.time_added.replace("Z", "+00:00")).timestamp()
        d["taint_receipt_minus_time_added_s"] = run.t_taint - added
    run.derived = {k: round(v, 4) for k, v in d.items()}


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:  # linear interpolation between order statistics (numpy's default)
        k = (len(ordered) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {
        "n": len(ordered),
        "min": ordered[0],
        "median": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


# ------------------------------------------------------------------------------------------ output --

ROWS = (
    ("inject -> taint", "inject_to_taint_s"),
    ("sample -> taint", "sample_to_taint_s"),
    ("  inject -> sample (scrape wait)", "inject_to_sample_s"),
    ("  sample -> cycle start (cycle wait)", "sample_to_cycle_start_s"),
    ("  cycle start -> taint (cycle work)", "cycle_start_to_taint_s"),
    ("recovery annotation -> untaint", "recovery_to_untaint_s"),
)


def per_run_table(runs: list[Run]) -> str:
    head = (
        f"{'run':>4} {'node/gpu':<14} {'load':>5} {'phase':>5} {'inj->smp':>8} {'smp->cyc':>8} "
        f"{'cyc->tnt':>8} {'smp->tnt':>8} {'inj->tnt':>8} {'missed':>6} {'untaint':>7}"
    )
    lines = [head]

    def f(run: Run, key: str) -> str:
        v = run.derived.get(key)
        return f"{v:8.3f}" if v is not None else f"{'-':>8}"

    for r in runs:
        phase = f"{r.phase:5.2f}" if r.phase is not None else f"{'-':>5}"
        untaint = r.derived.get("recovery_to_untaint_s")
        lines.append(
            f"{r.label:>4} {r.node + '/' + str(r.gpu):<14} {r.load_avg_1m:5.2f} "
            f"{phase} {f(r, 'inject_to_sample_s')} {f(r, 'sample_to_cycle_start_s')} "
            f"{f(r, 'cycle_start_to_taint_s')} {f(r, 'sample_to_taint_s')} {f(r, 'inject_to_taint_s')} "
            f"{r.cycles_missed:6d} {'-' if untaint is None else f'{untaint:.2f}':>7}"
        )
    return "\n".join(lines)


def summary_table(aggregates: dict[str, dict[str, float]], floor: float, interval: float) -> str:
    head = f"{'seconds':<38} {'median':>7} {'p90':>7} {'p99':>7} {'max':>7} {'mean':>7} {'n':>4}"
    lines = [head]
    for title, key in ROWS:
        s = aggregates.get(key)
        if not s:
            continue
        lines.append(
            f"{title:<38} {s['median']:7.3f} {s['p90']:7.3f} {s['p99']:7.3f} {s['max']:7.3f} "
            f"{s['mean']:7.3f} {s['n']:4d}"
        )
    lines.append("")
    for title, key, bound, name in (
        ("inject -> taint", "inject_to_taint_s", floor, "scrape + interval"),
        ("sample -> taint", "sample_to_taint_s", interval, "interval"),
    ):
        s = aggregates.get(key)
        if s:
            lines.append(
                f"{title} / {name} ({bound:g}s): median {s['median'] / bound:.2f}, "
                f"p90 {s['p90'] / bound:.2f}, p99 {s['p99'] / bound:.2f}, max {s['max'] / bound:.2f}"
            )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- main --


class AgentFleet:
    """Node agents as real processes (fake NVML) on some KWOK nodes, each writing its GPUHealthy
    condition with the cluster's admin kubeconfig; faults go in through each one's inbox."""

    def __init__(self, cluster: Cluster, nodes: list[SimNode], workdir: Path) -> None:
        self.nodes = nodes
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: dict[str, str] = {}
        self.inboxes: dict[str, Path] = {}
        env = {**cluster.env, "KUBECONFIG": cluster.kubeconfig, "PYTHONUNBUFFERED": "1"}
        for node in nodes:
            inbox = workdir / f"inbox-{node.name}"
            inbox.mkdir(parents=True, exist_ok=True)
            port = free_port()
            with (workdir / f"agent-{node.name}.log").open("ab") as log_file:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable, "-m", "gpu_efficiency_sim.fake_nvml", "agent",
                            "--fake-gpus", str(node.gpus), "--fake-profile", "idle",
                            "--node-name", node.name, "--interval", "1s",
                            "--listen", f"127.0.0.1:{port}", "--write-node-condition",
                            "--fake-inbox", str(inbox),
                        ],
                        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    )
                )  # fmt: skip
            self.urls[node.name] = f"http://127.0.0.1:{port}"
            self.inboxes[node.name] = inbox
        self.started = time.monotonic()

    def ready(self) -> bool:
        return all(_status(f"{url}/readyz") == 200 for url in self.urls.values())

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def inject_xid(self, node: str, gpu: int, code: int, name: str) -> float:
        """Drop the XID event into the node's inbox (renamed into place: read whole or not at all);
        the time of the rename is the injection's."""
        inbox = self.inboxes[node]
        staged = inbox / f"{name}.tmp"
        staged.write_text(json.dumps({"gpu": gpu, "event": "xid", "xid": code}))
        t = time.time()
        staged.rename(inbox / f"{name}.json")
        return t

    def event_time(self, node: str, gpu: int, code: int, after: float) -> float | None:
        """When the agent received the event (its /snapshot events), None if it did not."""
        snap = _get_json(f"{self.urls[node]}/snapshot")
        if not isinstance(snap, dict):
            return None
        uuids = {str(g["index"]): g["uuid"] for g in snap.get("gpus") or ()}
        for e in snap.get("events") or ():
            if (
                e.get("uuid") == uuids.get(str(gpu))
                and e.get("data") == code
                and float(e["time"]) >= after - 1
            ):
                return float(e["time"])
        return None

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return None


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return orjson.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None


@dataclass
class Rig:
    """What the runs act on and watch."""

    cluster: Cluster
    sim: Simulator
    nodes: list[SimNode]
    watch: NodeWatch
    op: OperatorProcess
    rules: RuleWatch | None = None  # the dra path: the taints are DeviceTaintRules
    agents: AgentFleet | None = None  # the agent path: faults come from these agents

    @property
    def kind(self) -> str:
        return "xid" if self.rules is not None or self.agents is not None else "ecc"

    @property
    def taints(self) -> NodeWatch:
        """What the taint shows up in: the node, or our DeviceTaintRules."""
        return self.rules if self.rules is not None else self.watch


def gpu_nodes(cluster: Cluster) -> list[SimNode]:
    """The cluster's KWOK GPU nodes as the simulator's nodes (same names, GPU counts and models)."""
    body = orjson.loads(cluster.core.list_node(_preload_content=False).data)
    nodes = []
    for item in body.get("items") or ():
        labels = item["metadata"].get("labels") or {}
        if labels.get("nvidia.com/gpu.present") == "true":
            nodes.append(
                SimNode(
                    item["metadata"]["name"],
                    int(labels["nvidia.com/gpu.count"]),
                    find_model(labels["nvidia.com/gpu.product"]),
                )
            )
    return sorted(nodes, key=lambda n: (len(n.name), n.name))


def wait_ready(rig: Rig, args: argparse.Namespace) -> None:
    """Prometheus (or each agent's history) holds enough of every GPU's fault series for the
    lookback's coverage rule (the policy's default minCoverage 0.6), and the operator runs steady cycles."""
    lookback = parse_duration(args.lookback)
    if rig.agents is not None:
        deadline = time.monotonic() + lookback + 180
        while time.monotonic() < deadline:
            if not rig.op.alive() or not rig.agents.alive():
                raise RuntimeError(f"the operator or an agent exited; see {rig.op.log_path.parent}")
            covered = time.monotonic() - rig.agents.started >= 0.6 * lookback + 10
            if covered and rig.agents.ready() and len(rig.op.poll()) >= 3:
                return
            time.sleep(2)
        raise RuntimeError(f"not ready: agents ready {rig.agents.ready()}, {len(rig.op.cycles)} cycles")
    need = math.ceil(0.6 * lookback / parse_duration(args.scrape_interval)) + 3
    gpus = sum(n.gpus for n in rig.nodes)
    series = f'{DBE}{{simulator="{SIM_NAME}"}}'
    query = f"min(count_over_time({series}[{int(lookback)}s])) and count({series}) == {gpus}"
    deadline = time.monotonic() + lookback + 180
    have = 0.0
    while time.monotonic() < deadline:
        if not rig.op.alive():
            raise RuntimeError(f"the operator exited ({rig.op.proc.returncode}); see {rig.op.log_path}")
        have = rig.cluster.prom_scalar(query)
        if have >= need and len(rig.op.poll()) >= 3:
            return
        time.sleep(2)
    raise RuntimeError(
        f"not ready: {have:.0f}/{need} samples per GPU in the lookback, {len(rig.op.cycles)} cycles"
    )


def request_recovery(core: client.CoreV1Api, node: str, kind: str = "ecc") -> float:
    """The admin's manual recovery (``kubectl annotate node N gpuefficiency.io/fault-recovered=ecc``)."""
    body = {"metadata": {"annotations": {FAULT_RECOVERED: kind}}}
    core.patch_node(node, body, _content_type="application/merge-patch+json", _preload_content=False)
    return time.time()


class RunError(Exception):
    """A run that cannot go on: its message says why."""


def one_run(rig: Rig, run: Run, not_before: float, timeout: float) -> int:
    """Inject, wait for the taint, find the sample, request the recovery; the watch mark after it."""
    if not rig.watch.wait_clean(run.node, timeout) or not rig.taints.wait_clean(run.node, timeout):
        raise RunError(f"node {run.node} still tainted or awaiting recovery {timeout:.0f}s later")
    time.sleep(max(0.0, not_before - time.time()))
    if not rig.op.alive():
        raise RunError(f"the operator exited ({rig.op.proc.returncode}); see {rig.op.log_path}")
    run.load_avg_1m = os.getloadavg()[0]
    mark = rig.taints.mark()
    if rig.agents is not None:
        if not rig.agents.alive():
            raise RunError("a node agent exited; see its log in the bench's workdir")
        run.value = run.code = AGENT_XID
        run.t_inject = rig.agents.inject_xid(run.node, run.gpu, run.code, f"run-{run.label}")
    else:
        if rig.rules is not None:
            run.value = run.code
            fault = Fault(FaultKind.XID, at=rig.sim.elapsed(), node=run.node, gpu=run.gpu, value=run.code)
        else:
            run.value = int((rig.sim.gpu_values(run.node, run.gpu) or {}).get(DBE, 0)) + 1
            fault = Fault(FaultKind.ECC, at=rig.sim.elapsed(), node=run.node, gpu=run.gpu, value=1)
        rig.sim.add_faults([fault])
        run.t_inject = time.time()  # every render from now on serves the new value
    hit = rig.taints.wait_kind(run.node, rig.kind, present=True, since=mark, timeout=timeout)
    if hit is None:
        raise RunError(
            f"run {run.label}: node {run.node} was never tainted within {timeout:.0f}s of the {rig.kind} fault "
            f"injected on its GPU {run.gpu} (operator log: {rig.op.log_path})"
        )
    run.t_taint, run.time_added = hit[1].t, hit[1].after.time_added
    run.t_recover_requested = request_recovery(rig.cluster.core, run.node, rig.kind)
    if rig.agents is not None:  # the agent's receipt of the NVML event: its source has it from then
        run.t_sample = rig.agents.event_time(run.node, run.gpu, run.code, run.t_inject)
        return hit[0] + 1
    metric = XID if rig.rules is not None else DBE
    found = first_sample(rig.cluster, run.node, run.gpu, run.value, run.t_inject, metric)
    if found is not None:
        run.t_sample, run.t_sample_before = found
    return hit[0] + 1


def measure(rig: Rig, args: argparse.Namespace, timeout: float) -> tuple[list[Run], str]:
    """Warm-up and measured runs, round robin over the nodes, each GPU in turn; the first failure ends them."""
    rng = random.Random(args.seed)
    runs: list[Run] = []
    since: dict[int, int] = {}
    last_taint = time.time()
    failure = ""
    for i in range(args.warmup + args.runs):
        node = rig.nodes[i % len(rig.nodes)]
        warmup = i < args.warmup
        run = Run(
            index=i + 1 if warmup else i - args.warmup + 1,
            warmup=warmup,
            node=node.name,
            gpu=(i // len(rig.nodes)) % node.gpus,
            code=RESET_XIDS[(i // (len(rig.nodes) * node.gpus)) % len(RESET_XIDS)],
            # A uniform random phase of the operator's cycle: the taint came at a fixed phase (just
            # after a cycle start), so wait a uniform share of one measured period after it.
            delay_s=round(0.5 + rng.uniform(0.0, rig.op.period(parse_duration(args.interval))), 3),
        )
        runs.append(run)
        try:
            since[id(run)] = one_run(rig, run, last_taint + run.delay_s, timeout)
        except RunError as exc:
            failure = str(exc)
            break
        assert run.t_taint is not None
        assert run.t_inject is not None
        last_taint = run.t_taint
        line = f"run {run.label}: {run.node}/{run.gpu} tainted {run.t_taint - run.t_inject:.2f}s after the injection"
        if run.t_sample is not None:
            line += f", {run.t_taint - run.t_sample:.2f}s after the sample"
        log(line)
    deadline = time.monotonic() + timeout
    for run in runs:  # untaint times of the recoveries (the last ones may still be pending)
        if id(run) in since:
            left = max(0.0, deadline - time.monotonic())
            hit = rig.taints.wait_kind(run.node, rig.kind, present=False, since=since[id(run)], timeout=left)
            run.t_untaint = hit[1].t if hit is not None else None
    return runs, failure


def start_simulator(cluster: Cluster, nodes: list[SimNode]) -> tuple[Simulator, MetricsServer, Path]:
    """The simulator in this process, rendering on every scrape (max_age 0): the served value
    changes the instant a fault is added. Registered with the cluster's Prometheus."""
    sim = Simulator(nodes)
    server = MetricsServer(sim, port=0, max_age=0.0).start()
    registered = register(
        SIM_NAME,
        [server.address],
        directory=cluster.state_dir / "prometheus" / "targets",
        labels={"job": DEFAULT_JOB, "simulator": SIM_NAME},
    )
    return sim, server, registered


def report(
    runs: list[Run], cycles: list[Cycle], args: argparse.Namespace, extra: dict[str, Any]
) -> dict[str, Any]:
    """The JSON document: settings, aggregates, ratios to the floor, every run."""
    interval, scrape = parse_duration(args.interval), parse_duration(args.scrape_interval)
    offset = vm_offset_s(args)
    floor = scrape + interval + offset
    for run in runs:
        decompose(run, cycles)
    measured = [r for r in runs if not r.warmup and r.t_taint is not None]
    aggregates = {key: stats([r.derived[key] for r in measured if key in r.derived]) for _, key in ROWS}
    phases = [r.phase for r in measured if r.phase is not None]
    periods = [b.start - a.start for a, b in itertools.pairwise(cycles)]

    def ratios(key: str, bound: float) -> dict[str, float]:
        s = aggregates.get(key) or {}
        return {k: round(s[k] / bound, 3) for k in ("median", "p90", "p99", "max") if k in s}

    return {
        **extra,
        "settings": {
            "scrape_interval_s": scrape,
            "interval_s": interval,
            "floor_s": floor,
            "metrics": args.metrics,
            "latency_offset_s": offset,
            "nodes": args.nodes,
            "runs": args.runs,
            "warmup": args.warmup,
            "seed": args.seed,
            "path": args.path,
            "fault": {
                "dra": "reset-class XID -> DeviceTaintRule (DRA)",
                "agent": f"XID {AGENT_XID} as an NVML event in a node agent -> node taint"
                + (" (no early cycles)" if args.no_early_cycles else ""),
            }.get(args.path, "ECC double-bit error -> node taint"),
            "circuit_breaker": "default maxTaintedFraction 0.2 (2 of 10 nodes); at most 2 taints overlap here",
        },
        "measured_runs": len(measured),
        "cycles": {
            "count": len(cycles),
            "median_period_s": statistics.median(periods) if periods else math.nan,
            "median_seconds": statistics.median(c.seconds for c in cycles) if cycles else math.nan,
            "max_seconds": max((c.seconds for c in cycles), default=math.nan),
        },
        "aggregates": aggregates,
        "ratios": {
            "inject_to_taint_over_floor": ratios("inject_to_taint_s", floor),
            "sample_to_taint_over_interval": ratios("sample_to_taint_s", interval),
        },
        "injection_phase_quartiles": [sum(1 for p in phases if b / 4 <= p < (b + 1) / 4) for b in range(4)],
        "runs_with_missed_cycles": sum(1 for r in measured if r.cycles_missed),
        "runs": [asdict(r) for r in runs],
    }


def print_report(doc: dict[str, Any], runs: list[Run], path: Path) -> None:
    settings, cycles, machine_ = doc["settings"], doc["cycles"], doc["machine"]
    print(per_run_table(runs))
    print()
    print(
        f"fault -> taint latency: {doc['measured_runs']} runs (+{settings['warmup']} warm-up), {settings['fault']}, "
        f"Enforce; {settings['metrics']} (latency offset {settings['latency_offset_s']:g}s); scrape "
        f"{settings['scrape_interval_s']:g}s, interval {settings['interval_s']:g}s, floor (scrape + interval"
        f" + offset) {settings['floor_s']:g}s; operator cycle period median "
        f"{cycles['median_period_s']:.2f}s, cycle median {cycles['median_seconds']:.3f}s, max {cycles['max_seconds']:.2f}s"
    )
    print(summary_table(doc["aggregates"], settings["floor_s"], settings["interval_s"]))
    print(
        f"injection phase by quarter of the cycle: {doc['injection_phase_quartiles']}; runs in which a cycle "
        f"started after the sample without tainting: {doc['runs_with_missed_cycles']}; circuit breaker "
        f"events: {len(doc['circuit_breaker_events'])}"
    )
    start, end = (tuple(round(x, 2) for x in machine_[k]) for k in ("load_avg_at_start", "load_avg_at_end"))
    print(
        f"machine: {machine_['cores']} cores ({machine_['cpu']}), load average {start} at start, {end} at end; "
        f"total {doc['total_seconds']:.0f}s"
    )
    source = doc["operator_source"]
    changes = f", {len(source['modified'])} file(s) modified" if source["modified"] else ""
    print(f"operator code: {source['package']} (commit {source['commit'] or 'unknown'}{changes})")
    print(f"JSON: {path}; operator log: {doc['workdir']}/operator.log")


def vm_offset_s(args: argparse.Namespace) -> float:
    """How much of the newest data the backend hides from queries (``-search.latencyOffset``)."""
    if args.metrics == "prometheus":
        return 0.0
    return parse_duration(args.vm_latency_offset or "2s")  # cluster.sh's GPUEFF_VM_LATENCY_OFFSET default


def source_info() -> dict[str, Any]:
    """Which operator code ran: the package's path, and the checkout's commit and local changes."""
    import gpu_efficiency.cli  # the package itself is a namespace package: no __file__

    package = Path(gpu_efficiency.cli.__file__).parent
    git = subprocess.run(
        ["git", "-C", str(package), "status", "--porcelain", "--", "."], capture_output=True, text=True
    )
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True)
    if git.returncode != 0 or head.returncode != 0:
        return {"package": str(package), "commit": None, "modified": None}
    return {"package": str(package), "commit": head.stdout.strip(), "modified": git.stdout.split("\n")[:-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=60, help="measured runs (~8 s each after ~2 min of set-up)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="runs first, reported but not counted")
    parser.add_argument("--interval", default="5s", help="the policy's evaluation interval")
    parser.add_argument("--scrape-interval", default="1s", help="Prometheus' scrape interval")
    parser.add_argument("--window", help="the policy's activity window (default: 60s or the interval)")
    parser.add_argument("--lookback", default="2m", help="the policy's faults.lookback")
    parser.add_argument("--nodes", type=int, default=10, help="KWOK GPU nodes (8 GPUs each)")
    parser.add_argument(
        "--run-timeout", type=float, help="seconds a run waits for its taint (default: 4 floors + 30)"
    )
    parser.add_argument("--seed", type=int, default=1, help="of the random injection delays")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster up afterwards")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--path",
        choices=("node", "dra", "agent"),
        default="node",
        help="node: ECC error -> node taint; dra: reset-class XID -> DeviceTaintRule for the one GPU; "
        "agent: XID as an NVML event in a node agent -> node taint",
    )
    parser.add_argument(
        "--agent-nodes",
        type=int,
        default=3,
        help="agent path: nodes with an agent (8 GPUs each, one run a GPU)",
    )
    parser.add_argument(
        "--no-early-cycles",
        action="store_true",
        help="agent path: the operator with --fault-wake-min-gap 0 (the agents are read at regular cycles only)",
    )
    parser.add_argument(
        "--metrics",
        choices=("prometheus", "victoriametrics", "victoriametrics-cluster"),
        default="prometheus",
        help="the metrics backend in Prometheus' place (cluster.sh up --metrics; the cluster version needs"
        " GPUEFF_VM_CLUSTER_BIN)",
    )
    parser.add_argument(
        "--vm-latency-offset",
        help="VictoriaMetrics' -search.latencyOffset (cluster.sh's GPUEFF_VM_LATENCY_OFFSET: 2s unless set;"
        " VictoriaMetrics' own default is 30s)",
    )
    args = parser.parse_args(argv)
    if args.vm_latency_offset is not None and args.metrics == "prometheus":
        parser.error("--vm-latency-offset is for --metrics victoriametrics or victoriametrics-cluster")
    if args.path == "agent" and not 1 <= args.agent_nodes < args.nodes:
        parser.error("--agent-nodes must be at least 1 and fewer than --nodes")
    if args.path == "agent" and args.warmup + args.runs > 8 * args.agent_nodes:
        parser.error("the agent path injects each GPU once: raise --agent-nodes to 8 GPUs per run")
    # Stop cleanly (operator, cluster) on SIGTERM, and on SIGINT even when started in the background.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    timeout = args.run_timeout or (
        4 * (parse_duration(args.scrape_interval) + parse_duration(args.interval)) + vm_offset_s(args) + 30
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = args.out / f"fault-latency-{stamp}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    info = machine()
    env = cluster_env(args.scrape_interval, args.vm_latency_offset)
    server: MetricsServer | None = None
    registered: Path | None = None
    rig: Rig | None = None
    agents: AgentFleet | None = None
    try:
        cluster = cluster_up(env, args.nodes, args.scrape_interval, args.metrics)
        nodes = gpu_nodes(cluster)
        extra: tuple[str, ...] = ()
        if args.path == "agent":
            agents = AgentFleet(cluster, nodes[: args.agent_nodes], workdir)
            extra = ("--agent-urls", ",".join(agents.urls.values()))
            extra += ("--fault-wake-min-gap", "0") if args.no_early_cycles else ()
        sim, server, registered = start_simulator(cluster, nodes[args.agent_nodes :] if agents else nodes)
        kubeconfig = install_crd_and_rbac(cluster, workdir)
        policy = apply_policy(cluster, args)
        watch = NodeWatch(cluster.core).start()
        rules = None
        if args.path == "dra":
            publish_slices(cluster, sim, nodes)
            rules = RuleWatch(client.CustomObjectsApi(cluster.core.api_client)).start()
        rig = Rig(
            cluster,
            sim,
            agents.nodes if agents else nodes,
            watch,
            OperatorProcess(cluster, kubeconfig, workdir / "operator.log", extra),
            rules,
            agents,
        )
        log(
            f"simulator on {server.url}; runs on {len(rig.nodes)} nodes; waiting for a full lookback of samples"
        )
        wait_ready(rig, args)
        log(f"ready after {len(rig.op.cycles)} operator cycles: {args.warmup} warm-up + {args.runs} runs")
        runs, failure = measure(rig, args, timeout)
        breaker_events = [
            e.message
            for e in cluster.core.list_event_for_all_namespaces(
                field_selector="reason=CircuitBreakerOpen"
            ).items
        ]
        operator_alive = rig.op.alive()
        cycles = rig.op.poll()
        watch_error = rig.watch.error
    finally:
        if rig is not None:
            rig.op.stop()
            rig.watch.stop()
            if rig.rules is not None:
                rig.rules.stop()
        if agents is not None:
            agents.stop()
        if registered is not None:
            unregister(registered)
        if server is not None:
            server.stop()
        if not args.keep_cluster:
            subprocess.run([str(CLUSTER_SH), "down", "--purge"], env=env, capture_output=True, text=True)
            log("bench cluster torn down (purged)")
    doc = report(
        runs,
        cycles,
        args,
        {
            "command": " ".join(["bench/fault_latency.py", *(argv if argv is not None else sys.argv[1:])]),
            "timestamp": stamp,
            "machine": {**info, "load_avg_at_end": os.getloadavg()},
            "operator_source": source_info(),
            "policy": policy,
            "failure": failure,
            "operator_alive_at_end": operator_alive,
            "circuit_breaker_events": breaker_events,
            "watch_error": watch_error,
            "workdir": str(workdir),
        },
    )
    doc["total_seconds"] = round(time.monotonic() - started, 1)
    path = args.out / f"fault-latency-{args.path}-{args.metrics}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2))
    print_report(doc, runs, path)
    if failure:
        print(f"\nFAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
