"""e2e harness: the local cluster, the chart's RBAC with a real ServiceAccount token, and the
operator as a separate process (`gpu-efficiency run`) that tests can kill and restart."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency.cleanup import LEASE_NAME
from gpu_efficiency.sources.metrics.prometheus import PrometheusClient, PrometheusConfig

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "hack" / "localcluster" / "cluster.sh"
BUILD_SH = ROOT / "hack" / "localcluster" / "build.sh"
CHART = ROOT / "charts" / "gpu-efficiency-operator"
OPERATOR_NAMESPACE = "gpu-efficiency-system"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
# cluster.sh builds its fake GPU nodes with the harness (gpu-efficiency-sim node-manifests): run it
# with this interpreter, which has the packages, rather than its default (the repo's .venv).
os.environ.setdefault("GPUEFF_PYTHON", sys.executable)

T = TypeVar("T")


@functools.cache
def _prometheus(url: str, timeout: float) -> PrometheusClient:
    return PrometheusClient(PrometheusConfig(url=url, timeout=timeout))


def prom_query(prometheus_url: str, promql: str, timeout: float = 5) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) series of an instant query, through the operator's own client (one per
    URL); SourceUnavailable on a transport, HTTP or PromQL error, or a non-vector answer."""
    return _prometheus(prometheus_url, timeout).query(promql)


def wait_for(
    probe: Callable[[], T | None], timeout: float, interval: float = 0.5, what: str = "condition"
) -> T:
    """Poll until probe returns a truthy value; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: Path | None
    state_dir: Path | None
    prometheus_url: str
    started_here: bool = False

    @property
    def kubectl(self) -> str:
        if self.bin_dir and (self.bin_dir / "kubectl").exists():
            return str(self.bin_dir / "kubectl")
        return shutil.which("kubectl") or "kubectl"

    @property
    def helm(self) -> str:
        if self.bin_dir and (self.bin_dir / "helm").exists():
            return str(self.bin_dir / "helm")
        found = shutil.which("helm")
        if not found:
            raise AssertionError("helm not found: run hack/localcluster/build.sh")
        return found

    def run(
        self, *args: str, input_: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        proc = subprocess.run(args, input=input_, capture_output=True, text=True, env=env, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc

    def kubectl_run(
        self, *args: str, input_: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run(self.kubectl, *args, input_=input_, check=check)

    def api_client(self) -> client.ApiClient:
        return kube_config.new_client_from_config(config_file=self.kubeconfig)

    def prometheus_targets_dir(self) -> Path | None:
        return self.state_dir / "prometheus" / "targets" if self.state_dir else None


def start_cluster() -> Cluster:
    """The local cluster (built and started on first use), or KUBECONFIG's when asked to."""
    if os.environ.get("GPUEFF_USE_EXISTING_CLUSTER") == "1":
        kubeconfig = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        return Cluster(
            kubeconfig=kubeconfig,
            bin_dir=None,
            state_dir=None,
            prometheus_url=os.environ.get("GPUEFF_PROMETHEUS_URL", "http://127.0.0.1:9090"),
        )
    build = subprocess.run([str(BUILD_SH)], capture_output=True, text=True, timeout=5400)
    if build.returncode != 0:
        raise RuntimeError(
            f"building the local cluster failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
        )
    bin_dir = Path(build.stdout.strip().splitlines()[-1])
    status = subprocess.run([str(CLUSTER_SH), "status"], capture_output=True, text=True)
    started_here = status.returncode != 0
    up = subprocess.run([str(CLUSTER_SH), "up", "--nodes", "2"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        raise RuntimeError(f"cluster.sh up failed:\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}")
    env = subprocess.run([str(CLUSTER_SH), "env"], capture_output=True, text=True, check=True).stdout
    values = dict(
        line.removeprefix("export ").split("=", 1)
        for line in env.replace(";", "\n").splitlines()
        if "=" in line
    )
    state_dir = Path(os.environ.get("GPUEFF_STATE_DIR", "/tmp/gpueff-localcluster"))
    return Cluster(
        kubeconfig=values["KUBECONFIG"].strip().strip("'\""),
        bin_dir=bin_dir,
        state_dir=state_dir,
        prometheus_url=values.get("GPUEFF_PROMETHEUS_URL", "http://127.0.0.1:19090").strip().strip("'\""),
        started_here=started_here,
    )


def stop_cluster(cluster: Cluster) -> None:
    if cluster.started_here and os.environ.get("GPUEFF_KEEP_CLUSTER") != "1":
        subprocess.run([str(CLUSTER_SH), "down"], capture_output=True, text=True, timeout=120)


def install_crds(cluster: Cluster) -> None:
    cluster.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    # `kubectl wait` fails at once, instead of waiting, on a CRD that has no status conditions yet
    # (a fresh API server under load answers the apply before the CRD controller has seen it).
    waited = wait_for(
        lambda: (
            cluster.kubectl_run(
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/gpuefficiencypolicies.gpuefficiency.io",
                check=False,
            ).returncode
            == 0
        ),
        120,
        interval=2,
        what="the policy CRD Established",
    )
    assert waited


def chart_rbac_docs(cluster: Cluster, namespace: str = OPERATOR_NAMESPACE) -> list[dict[str, Any]]:
    # rbac.mode=enforce: the e2e policies run in Enforce (evict, reclaim, quarantine).
    rendered = cluster.run(
        cluster.helm, "template", "e2e", str(CHART), "--namespace", namespace, "--set", "rbac.mode=enforce"
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") in RBAC_KINDS]


@dataclass
class OperatorIdentity:
    namespace: str
    service_account: str
    kubeconfig: str

    def run_command(self, cluster: Cluster, *extra: str) -> str:
        """``gpu-efficiency run`` against the cluster's Prometheus, in our namespace, no fixed ports."""
        return " ".join(
            (
                f"{sys.executable} -m gpu_efficiency.cli run --prometheus-url {cluster.prometheus_url}",
                f"--operator-namespace {self.namespace} --metrics-port 0 --health-port 0",
                *extra,
            )
        )


def install_operator_rbac(cluster: Cluster, workdir: Path) -> OperatorIdentity:
    """Apply the chart's RBAC and build a kubeconfig holding a ServiceAccount token (TokenRequest)."""
    cluster.kubectl_run("create", "namespace", OPERATOR_NAMESPACE, check=False)
    docs = chart_rbac_docs(cluster)
    cluster.kubectl_run("apply", "-n", OPERATOR_NAMESPACE, "-f", "-", input_=yaml.safe_dump_all(docs))
    accounts = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount" and "agent" not in d["metadata"]["name"]
    ]
    assert accounts, "the chart renders no operator ServiceAccount"
    sa = accounts[0]
    api = client.CoreV1Api(cluster.api_client())
    token = api.create_namespaced_service_account_token(
        sa,
        OPERATOR_NAMESPACE,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc"], expiration_seconds=24 * 3600
            )
        ),
    ).status.token
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server_cluster = admin["clusters"][0]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server_cluster["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": sa}}],
        "current-context": "operator",
    }
    path = workdir / "operator-kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return OperatorIdentity(namespace=OPERATOR_NAMESPACE, service_account=sa, kubeconfig=str(path))


@dataclass
class OperatorProcess:
    """`gpu-efficiency run` as a real process, with the ServiceAccount's kubeconfig."""

    identity: OperatorIdentity
    prometheus_url: str
    log_dir: Path
    extra_args: tuple[str, ...] = ()
    name: str = field(default_factory=lambda: f"op-{uuid.uuid4().hex[:6]}")
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (e.g. libfaketime's)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> OperatorProcess:
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts} =====\n".encode())
        env = {**os.environ, "KUBECONFIG": self.identity.kubeconfig, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpu_efficiency.cli",
                "run",
                "--prometheus-url",
                self.prometheus_url,
                "--operator-namespace",
                self.identity.namespace,
                "--metrics-port",
                "0",
                "--health-port",
                "0",
                "--identity",
                self.name,
                "--lease-seconds",
                "6",
                "--status-refresh-seconds",
                "30",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Graceful stop (Kopf cleanup releases the Lease); SIGKILL if it does not end in 20 s."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return bool(self.proc and self.proc.poll() is None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def gpu_condition(core: client.CoreV1Api, node: str) -> Any:
    """The node's GPUHealthy condition (the agent's or the operator's), or None."""
    conditions = core.read_node(node).status.conditions or []
    return next((c for c in conditions if c.type == names.GPU_HEALTHY), None)


def read_lease(api: client.ApiClient) -> client.V1Lease | None:
    """The operators' leader-election Lease in our namespace, or None when it cannot be read."""
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(LEASE_NAME, OPERATOR_NAMESPACE)
    except ApiException:
        return None


def live_lease_holder(api: client.ApiClient) -> str:
    """Who leads now: the Lease's holder while its last renewal is younger than its duration, else ""
    (a killed operator's Lease keeps its holder until it expires)."""
    lease = read_lease(api)
    spec = lease.spec if lease is not None else None
    if spec is None or not spec.holder_identity or spec.renew_time is None:
        return ""
    age = time.time() - spec.renew_time.timestamp()
    return str(spec.holder_identity) if age < (spec.lease_duration_seconds or 15) else ""


def drop_lease_of(api: client.ApiClient, holders: set[str]) -> None:
    """Delete the Lease when one of ``holders`` (stopped operators) still holds it: a test that kills
    its operator leaves the Lease held until it expires, and the next test's operator would wait for
    that. Only for processes known to be gone; a live holder's Lease is never touched."""
    lease = read_lease(api)
    if (
        lease is None
        or lease.spec is None
        or lease.metadata is None
        or lease.spec.holder_identity not in holders
    ):
        return
    with contextlib.suppress(ApiException):  # changed meanwhile (another holder) or already gone
        client.CoordinationV1Api(api).delete_namespaced_lease(
            LEASE_NAME,
            OPERATOR_NAMESPACE,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=lease.metadata.resource_version)
            ),
        )


def create_namespace(api: client.ApiClient, prefix: str, labels: dict[str, str] | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    wait_for(lambda: _has_default_sa(api, name), 30, what=f"default ServiceAccount in {name}")
    return name


def _has_default_sa(api: client.ApiClient, namespace: str) -> bool:
    try:
        client.CoreV1Api(api).read_namespaced_service_account("default", namespace)
    except ApiException:
        return False
    return True


def delete_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_namespace(name, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def pod_events(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [e.reason for e in events.items]


def pod_events_after(
    api: client.ApiClient, namespace: str, name: str, reason: str, timeout: float = 30
) -> list[str]:
    """The pod's event reasons once ``reason`` is among them.

    An event that follows an action (GPUIdleEvicted after the eviction) is written just after the
    action becomes visible, so a test that saw the action must wait for the event, not race it.
    """

    def seen() -> list[str] | None:
        reasons = pod_events(api, namespace, name)
        return reasons if reason in reasons else None

    return wait_for(
        seen,
        timeout,
        what=f"a {reason} event on {namespace}/{name}",
    )


def built_tool(name: str, env: str) -> str:
    """``name`` as built by hack/localcluster/build.sh (or the path in ``env``, or ``name`` on PATH).
    Fails, never skips."""
    explicit = os.environ.get(env)
    if explicit:
        return explicit
    bindir = subprocess.run([str(BUILD_SH), "--print-bindir"], capture_output=True, text=True, check=True)
    built = Path(bindir.stdout.strip().splitlines()[-1]) / name
    if built.exists():
        return str(built)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    pytest.fail(
        f"{name} not found at {built}: build it with `hack/localcluster/build.sh` (or set {env}=/path/to/{name})"
    )
