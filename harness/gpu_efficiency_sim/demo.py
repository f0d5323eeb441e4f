"""``make demo``: the product's story on the local cluster, live, in a few minutes.

Starts (or reuses) the local control plane and Prometheus, plays the shipped demo scenario with the
operator as a real process, shows a refreshing table of pods, verdicts, taints and events until
the idle notebooks are reclaimed and the faulty node is tainted, prints the report, and cleans up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency_sim.kube import api_client
from gpu_efficiency_sim.runner import RunOptions, run_scenario
from gpu_efficiency_sim.scenario import load_scenario

SCENARIO = Path(__file__).parent / "scenarios" / "demo.yaml"
REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "hack" / "localcluster" / "cluster.sh"
OPERATOR_NAMESPACE = "gpu-efficiency-system"


def _cluster_env() -> dict[str, str]:
    """Bring the local cluster up (a no-op when it runs) and return its environment."""
    if not CLUSTER_SH.exists():
        raise SystemExit("make demo runs from a source checkout (hack/localcluster/cluster.sh not found)")
    print(
        "… starting the local cluster (the first run builds Kubernetes from source: ~10 minutes)", flush=True
    )
    up = subprocess.run([str(CLUSTER_SH), "up", "--nodes", "0"], text=True, capture_output=True)
    if up.returncode != 0:
        raise SystemExit(f"cluster.sh up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
    out = subprocess.run([str(CLUSTER_SH), "env"], text=True, capture_output=True, check=True).stdout
    env = {}
    for line in out.replace(";", "\n").splitlines():
        if "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            env[key.strip()] = value.strip().strip("'\"")
    return env


class LiveView:
    """A refreshing table of what the operator did, read from the API server like a user would."""

    def __init__(self, api: Any, namespaces: list[str], node_prefix: str, tty: bool) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.namespaces, self.node_prefix, self.tty = namespaces, node_prefix, tty
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-view", daemon=True)
        self.started = time.monotonic()

    def say(self, line: str) -> None:
        self.lines.append(line)
        if not self.tty:
            print(line, flush=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=10)
        print(self.render(), flush=True)

    def _loop(self) -> None:
        period = 2.0 if self.tty else 20.0
        while not self._stop.wait(period):
            frame = self.render()
            print(("\x1b[2J\x1b[H" + frame) if self.tty else frame, flush=True)

    def render(self) -> str:
        try:
            return self._render()
        except ApiException as exc:
            return f"(cannot read the cluster: {exc.status} {exc.reason})"

    def _render(self) -> str:
        t = time.monotonic() - self.started
        out = [f"gpu-efficiency demo — {t:4.0f}s   (pods, verdicts and taints as `kubectl` shows them)", ""]
        out.append(f"{'POD':42} {'STATE':13} {'DIAGNOSIS':19} {'SM ACT':>6} {'UTIL':>5}  EVICT-AFTER")
        for ns in self.namespaces:
            for pod in self.core.list_namespaced_pod(ns).items:
                a = pod.metadata.annotations or {}
                phase = "Terminating" if pod.metadata.deletion_timestamp else pod.status.phase
                state = a.get(names.STATE, "-") if phase == "Running" else phase
                out.append(
                    f"{ns + '/' + pod.metadata.name:42.42} {state:13} {a.get(names.DIAGNOSIS, '-'):19} "
                    f"{a.get(names.SM_ACTIVE, '-'):>6} {a.get(names.GPU_UTIL, '-'):>5}  {a.get(names.EVICT_AFTER, '')}"
                )
        out += ["", f"{'NODE':14} {'GPU HEALTHY':12} TAINTS"]
        for node in self.core.list_node().items:
            if not node.metadata.name.startswith(self.node_prefix):
                continue
            healthy = next(
                (c.status for c in node.status.conditions or [] if c.type == names.GPU_HEALTHY), "-"
            )
            taints = ", ".join(
                f"{t.key}={t.value}:{t.effect}"
                for t in node.spec.taints or []
                if t.key.startswith("gpuefficiency")
            )
            out.append(f"{node.metadata.name:14} {healthy:12} {taints or '-'}")
        reasons = []
        for ns in [*self.namespaces, "default"]:
            for ev in self.core.list_namespaced_event(ns).items:
                if ev.source and ev.source.component == "gpu-efficiency-operator":
                    reasons.append(
                        (
                            ev.last_timestamp or ev.first_timestamp,
                            ev.involved_object.name,
                            ev.reason,
                            ev.message,
                        )
                    )
        reasons.sort(key=lambda r: str(r[0]))
        out += ["", "RECENT EVENTS"] + [f"  {r[2]:26} {r[1]:28.28} {r[3][:80]}" for r in reasons[-8:]]
        out += ["", "EXPECTATIONS"] + [
            f"  {line}" for line in self.lines if line.lstrip().startswith(("PASS", "FAIL"))
        ]
        return "\n".join(out)


def _report(env: dict[str, str], policy: str) -> Callable[[], None]:
    def run() -> None:
        print("\n== gpu-efficiency report --policy demo ==", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_efficiency.cli",
                "report",
                "--policy",
                policy,
                "--prometheus-url",
                env["GPUEFF_PROMETHEUS_URL"],
            ],
            env={**os.environ, **env},
            check=False,
        )

    return run


def _then(*steps: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()

    return run


def demo_main(args: argparse.Namespace) -> int:
    env = _cluster_env()
    os.environ.update(env)
    loaded = load_scenario(SCENARIO)
    scenario = loaded.scenario
    api = api_client(env["KUBECONFIG"])
    view = LiveView(api, sorted(scenario.namespace_names), "demo-gpu-", sys.stdout.isatty())
    operator_cmd = (
        f"{sys.executable} -m gpu_efficiency.cli run --prometheus-url {env['GPUEFF_PROMETHEUS_URL']} "
        f"--operator-namespace {OPERATOR_NAMESPACE} --no-leader-election --metrics-port 0 --health-port 0"
    )
    print(f"… playing {SCENARIO.name}: {scenario.description}", flush=True)
    view.start()
    try:
        result = run_scenario(
            SCENARIO,
            RunOptions(
                kubeconfig=env["KUBECONFIG"],
                prometheus_url=env["GPUEFF_PROMETHEUS_URL"],
                operator_cmd=operator_cmd,
                output=view.say,
                keep=args.keep,
                before_teardown=_then(view.stop, _report(env, "demo")),
                setup_timeout=args.timeout,
            ),
        )
    finally:
        view.stop()
    if args.keep:
        print(f"\nThe demo's objects were kept: `gpu-efficiency-sim cleanup {SCENARIO}` removes them.")
    print(
        f"\n{'Demo finished' if result.passed else 'Demo FAILED'} in {result.duration_s:.0f}s. "
        "The local cluster is still running: `make cluster-down` stops it "
        "(`hack/localcluster/cluster.sh down --purge` also deletes its data).",
        flush=True,
    )
    return 0 if result.passed else 1
