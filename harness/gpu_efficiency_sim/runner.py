"""Running a scenario against the current cluster: create, simulate, observe, judge, clean up.

Order matters and is fixed: fake GPU nodes (Ready under KWOK) and namespaces, the simulator
(registered with Prometheus), the operator process, the policies, then t=0: the simulator clock
starts and the workloads and PDBs are created. Every deadline counts from t=0. Whatever happens,
cleanup removes what this run created (unless --keep), stops the operator and unregisters the
target.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Final

import orjson
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusClient, PrometheusConfig
from gpu_efficiency_sim import manifests
from gpu_efficiency_sim.expectations import Names, Outcome, Tracker
from gpu_efficiency_sim.kube import ClaimPoller, PodWatcher, api_client
from gpu_efficiency_sim.observation import Observation, WorkloadHistory, update_histories
from gpu_efficiency_sim.operator_process import DEFAULT_OPERATOR_CMD, OperatorProcess
from gpu_efficiency_sim.playbook import sim_faults, sim_nodes, sim_options, workload_plays
from gpu_efficiency_sim.scenario import LoadedScenario, WorkloadKind, WorkloadSpec, load_scenario, seconds
from gpu_efficiency_sim.server import MetricsServer
from gpu_efficiency_sim.simulator import Simulator
from gpu_efficiency_sim.targets import DEFAULT_JOB, register, targets_dir, unregister

CRD_NAME: Final = f"{PLURAL}.{GROUP}"
DEFAULT_PROMETHEUS_URL: Final = "http://127.0.0.1:19090"


def _stdout(line: str) -> None:
    print(line, flush=True)


@dataclass
class RunOptions:
    keep: bool = False
    """Leave the created objects in place (clean up later with `gpu-efficiency-sim cleanup`)."""
    operator: bool = True
    """Start the operator (also skipped when the scenario says needsOperator: false)."""
    operator_cmd: str = DEFAULT_OPERATOR_CMD
    """Shell-style command; $VARS expand against the operator's environment."""
    operator_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the operator (e.g. KUBECONFIG of its ServiceAccount)."""
    namespace_prefix: str = ""
    kubeconfig: str | None = None
    prometheus_url: str | None = None
    """Default: $GPUEFF_PROMETHEUS_URL, else http://127.0.0.1:19090."""
    targets_dir: Path | None = None
    """Prometheus file-SD directory; default from $GPUEFF_PROMETHEUS_TARGETS_DIR / $GPUEFF_STATE_DIR."""
    log_dir: Path | None = None
    """Where the operator log goes; default a temporary directory."""
    crds_dir: Path | None = None
    setup_timeout: float = 120.0
    poll_interval: float = 1.0
    run_id: str | None = None
    output: Callable[[str], None] = _stdout
    before_teardown: Callable[[], None] | None = None
    """Called once the expectations are decided, while the simulator and operator still run."""


@dataclass
class ScenarioResult:
    scenario: str
    path: Path
    run_id: str
    expected: int
    outcomes: list[Outcome] = field(default_factory=list)
    error: str | None = None
    operator_log: Path | None = None
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and len(self.outcomes) == self.expected
            and all(o.passed for o in self.outcomes)
        )

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.passed]


class SetupError(Exception):
    """The scenario could not be put in place; the message says what and why."""


def run_scenario(path: Path | str, options: RunOptions | None = None) -> ScenarioResult:
    """Run one scenario file; raises ScenarioError when the file is invalid (nothing is created)."""
    loaded = load_scenario(path)
    return ScenarioRun(loaded, options or RunOptions()).run()


def events_since(events: list[dict[str, Any]], since: float | None) -> list[dict[str, Any]]:
    """Events created at or after ``since`` (API server time). Nodes and policies keep their names
    from run to run, and their events (in ``default``) outlive the objects by an hour: an earlier
    run's NodeTainted must not pass this run's expectation."""
    if since is None:
        return events
    out = []
    for event in events:
        text = (event.get("metadata") or {}).get("creationTimestamp")
        try:
            created = datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
        except ValueError:
            created = since  # unknown: kept
        if created >= since:
            out.append(event)
    return out


def _json(response: Any) -> Any:
    return orjson.loads(response.data)


def _find_crds(options: RunOptions, scenario_path: Path) -> list[dict[str, Any]]:
    """CRD documents from crds/ (next to the scenario, upwards, or the working directory), else generated."""
    candidates = [options.crds_dir] if options.crds_dir else []
    for start in (scenario_path.resolve().parent, Path.cwd()):
        candidates += [p / "crds" for p in (start, *start.parents)]
    for directory in candidates:
        if directory and (directory / f"{GROUP}_{PLURAL}.yaml").exists():
            docs = []
            for file in sorted(directory.glob("*.yaml")):
                docs += [d for d in yaml.safe_load_all(file.read_text()) if d]
            return docs
    from gpu_efficiency.api.crd import render_crd

    return [d for d in yaml.safe_load_all(render_crd()) if d]


class ScenarioRun:
    """One run of one scenario. ``run`` never leaves objects behind unless asked to."""

    def __init__(self, loaded: LoadedScenario, options: RunOptions) -> None:
        self.loaded = loaded
        self.scenario = loaded.scenario
        self.name = loaded.name
        self.options = options
        self.run_id = options.run_id or uuid.uuid4().hex[:6]
        self.say = options.output
        self.prometheus_url = (
            options.prometheus_url or os.environ.get("GPUEFF_PROMETHEUS_URL") or DEFAULT_PROMETHEUS_URL
        ).rstrip("/")
        self.prometheus = PrometheusClient(PrometheusConfig(url=self.prometheus_url, timeout=5))
        prefix = options.namespace_prefix
        self.namespaces = {ns: prefix + ns for ns in self.scenario.namespace_names}
        self.names = Names(
            workloads={w.name: (self.namespaces[w.namespace], w.name) for w in self.scenario.workloads},
            nodes={n: n for n in self.scenario.node_names},
        )
        self.histories = {key: WorkloadHistory(*key) for key in self.names.workloads.values()}
        self._late_created: set[str] = set()
        self.tracker = Tracker(list(self.scenario.expectations))
        self.result = ScenarioResult(self.name, loaded.path, self.run_id, len(self.scenario.expectations))
        self.sim: Simulator | None = None
        self.target_name = f"sim-{self.name}-{self.run_id}"
        self._servers: list[MetricsServer] = []
        self._watcher: PodWatcher | None = None
        self._claims: ClaimPoller | None = None
        self._node_uids: dict[str, str] = {}
        self._targets_file: Path | None = None
        self._operator: OperatorProcess | None = None
        self._api: Any = None
        self._created_policies: list[str] = []
        self._created_nodes: list[str] = []
        self._created_namespaces: list[str] = []
        # API server time of this run's first node: events created before it are not this run's
        self._since: float | None = None

    # ---- the whole run -------------------------------------------------------------------------

    def run(self) -> ScenarioResult:
        started = time.monotonic()
        self.say(f"scenario {self.name} ({self.loaded.path}), run {self.run_id}")
        try:
            self._api = api_client(self.options.kubeconfig)
            self._setup()
            self._observe()
            if self.options.before_teardown is not None:
                self.options.before_teardown()
        except SetupError as e:
            self.result.error = str(e)
            self.say(f"ERROR setup: {e}")
        except ApiException as e:
            self.result.error = f"Kubernetes API error: {e.status} {e.reason}: {_api_message(e)}"
            self.say(f"ERROR {self.result.error}")
        except (urllib3.exceptions.HTTPError, ConfigException, OSError) as e:
            self.result.error = f"cannot reach the cluster: {e}"
            self.say(f"ERROR {self.result.error}")
        except KeyboardInterrupt:
            self.result.error = "interrupted"
            self.say("interrupted: cleaning up")
        finally:
            self._teardown()
        self.result.duration_s = time.monotonic() - started
        passed = sum(o.passed for o in self.result.outcomes)
        verdict = "PASSED" if self.result.passed else "FAILED"
        self.say(
            f"{verdict}: {passed}/{self.result.expected} expectations passed "
            f"({self.result.duration_s:.0f}s, scenario {self.name}, run {self.run_id})"
        )
        return self.result

    # ---- setup ---------------------------------------------------------------------------------

    def _setup(self) -> None:
        core: Any = client.CoreV1Api(self._api)
        self._remove_leftovers()
        needs_operator = self.options.operator and self.scenario.needs_operator
        if self.loaded.policies or needs_operator:
            self._ensure_crd()
        for scenario_ns, real in self.namespaces.items():
            ns_spec = self.scenario.namespaces.get(scenario_ns)
            body = manifests.namespace(
                real,
                self.name,
                self.run_id,
                ns_spec.labels if ns_spec else {},
                ns_spec.annotations if ns_spec else {},
            )
            self._create(partial(core.create_namespace, body), f"namespace {real}")
            self._created_namespaces.append(real)
        for spec in self.scenario.nodes:
            for name in spec.names:
                body = manifests.node(name, spec, self.name, self.run_id, isolate=self.scenario.isolate_nodes)
                created = self._create(partial(core.create_node, body), f"node {name}")
                self._created_nodes.append(name)
                self._node_uids[name] = str(getattr(getattr(created, "metadata", None), "uid", "") or "")
                stamp = getattr(getattr(created, "metadata", None), "creation_timestamp", None)
                if stamp is not None and self._since is None:
                    self._since = stamp.timestamp()
                core.patch_node_status(name, {"status": body["status"]})
        self._wait_nodes_ready(core)
        self._start_simulator()
        self._publish_dra_devices()
        if needs_operator:
            self._start_operator()
        custom: Any = client.CustomObjectsApi(self._api)
        for name, policy_spec in self.loaded.policies.items():
            manifest = manifests.policy(
                name,
                policy_spec,
                self.name,
                self.run_id,
                scope=self.scenario.scope_policies,
                namespace_prefix=self.options.namespace_prefix,
                scenario_namespaces=tuple(self.namespaces),
            )
            self._create(
                partial(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, manifest),
                f"policy {name}",
            )
            self._created_policies.append(name)
        assert self.sim is not None
        self.sim.restart_clock()  # t=0
        self._create_workloads()
        self.say(
            f"  created {len(self._created_nodes)} node(s), {len(self._created_namespaces)} namespace(s), "
            f"{len(self.scenario.workloads)} workload(s), {len(self._created_policies)} polic(y/ies); "
            f"t=0, {self.result.expected} expectation(s), last deadline {self.tracker.deadline:.0f}s"
        )

    def _create(self, call: Callable[[], Any], what: str) -> Any:
        try:
            return call()
        except ApiException as e:
            raise SetupError(f"creating {what} failed: {e.status} {e.reason}: {_api_message(e)}") from None

    def _remove_leftovers(self) -> None:
        """Objects of an earlier run of this scenario (--keep, or a crash) go first; strangers stop us."""
        core: Any = client.CoreV1Api(self._api)
        custom: Any = client.CustomObjectsApi(self._api)
        ours = f"{manifests.MANAGED_BY_KEY}={manifests.MANAGED_BY},{manifests.SCENARIO_LABEL}={self.name}"
        old_nodes = [
            n["metadata"]["name"]
            for n in _json(core.list_node(label_selector=ours, _preload_content=False))["items"]
        ]
        old_ns = [
            n["metadata"]["name"]
            for n in _json(core.list_namespace(label_selector=ours, _preload_content=False))["items"]
        ]
        try:
            old_policies = [
                p["metadata"]["name"]
                for p in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector=ours)[
                    "items"
                ]
            ]
        except ApiException as e:
            if e.status != 404:
                raise
            old_policies = []
        if old_nodes or old_ns or old_policies:
            self.say(
                f"  removing leftovers of an earlier run: {len(old_nodes)} node(s), "
                f"{len(old_ns)} namespace(s), {len(old_policies)} polic(y/ies)"
            )
            self._delete_all(old_policies, old_ns, old_nodes, wait=True)
        for name in self.scenario.node_names:
            self._refuse_stranger(partial(core.read_node, name), f"node {name}")
        for real in self.namespaces.values():
            self._refuse_stranger(partial(core.read_namespace, real), f"namespace {real}")
        for name in self.loaded.policies:
            self._refuse_stranger(
                partial(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, name), f"policy {name}"
            )

    def _refuse_stranger(self, read: Callable[[], Any], what: str) -> None:
        try:
            obj = read()
        except ApiException as e:
            if e.status == 404:
                return
            raise
        meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
        labels = (meta.get("labels") if isinstance(meta, dict) else meta.labels) or {}
        if labels.get(manifests.MANAGED_BY_KEY) != manifests.MANAGED_BY:
            raise SetupError(f"{what} already exists and was not created by the scenario runner")
        raise SetupError(f"{what} already exists (another run of a scenario with the same names?)")

    def _ensure_crd(self) -> None:
        ext: Any = client.ApiextensionsV1Api(self._api)
        try:
            ext.read_custom_resource_definition(CRD_NAME)
            return
        except ApiException as e:
            if e.status != 404:
                raise
        for doc in _find_crds(self.options, self.loaded.path):
            if doc.get("kind") == "CustomResourceDefinition":
                self.say(f"  installing CRD {doc['metadata']['name']}")
                self._create(
                    partial(ext.create_custom_resource_definition, doc), f"CRD {doc['metadata']['name']}"
                )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crd = _json(ext.read_custom_resource_definition(CRD_NAME, _preload_content=False))
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return
            time.sleep(0.5)
        raise SetupError(f"CRD {CRD_NAME} was not Established within 60s")

    def _wait_nodes_ready(self, core: Any) -> None:
        deadline = time.monotonic() + self.options.setup_timeout
        selector = f"{manifests.RUN_LABEL}={self.run_id}"
        pending = set(self._created_nodes)
        while pending:
            for node in _json(core.list_node(label_selector=selector, _preload_content=False))["items"]:
                conditions = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                    pending.discard(node["metadata"]["name"])
            if not pending:
                return
            if time.monotonic() > deadline:
                raise SetupError(
                    f"node(s) {', '.join(sorted(pending))} not Ready after {self.options.setup_timeout:.0f}s "
                    "(is the KWOK controller running and managing nodes annotated kwok.x-k8s.io/node=fake?)"
                )
            time.sleep(0.5)

    def _start_simulator(self) -> None:
        self.sim = Simulator(
            sim_nodes(self.scenario),
            workloads=workload_plays(self.scenario, self.options.namespace_prefix),
            faults=sim_faults(self.scenario),
            options=sim_options(self.scenario),
        )
        server = MetricsServer(self.sim).start()
        self._servers.append(server)
        self._watcher = PodWatcher(self._api, self.sim.set_pods).start()
        if not self._watcher.wait_synced(30):
            raise SetupError("the simulator could not list pods within 30s")
        target = self.target_name
        directory = self.options.targets_dir or targets_dir()
        self._targets_file = register(
            target, [server.address], directory=directory, labels={"job": DEFAULT_JOB, "simulator": target}
        )
        self.say(f"  simulator {server.url} registered in {self._targets_file}")
        self._wait_scraped(server.address)

    def _wait_scraped(self, address: str) -> None:
        """Prometheus should scrape the target before t=0; warn (do not fail) if it does not."""
        deadline = time.monotonic() + 30
        last = ""
        while time.monotonic() < deadline:
            try:
                result = self.prometheus.query(f'up{{instance="{address}"}}')
                if result and result[0][1] == 1:
                    return
                last = "target not scraped yet"
            except SourceUnavailable as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.5)
        self.say(
            f"  WARNING Prometheus at {self.prometheus_url} has not scraped {address} within 30s ({last})"
        )

    def _start_operator(self) -> None:
        log_dir = self.options.log_dir or Path(tempfile.mkdtemp(prefix="gpueff-scenario-"))
        env = dict(os.environ)
        if self.options.kubeconfig:
            env["KUBECONFIG"] = self.options.kubeconfig
        env["GPUEFF_PROMETHEUS_URL"] = self.prometheus_url
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.options.operator_env)
        log_path = log_dir / f"operator-{self.name}-{self.run_id}.log"
        self._operator = OperatorProcess(self.options.operator_cmd, env, log_path).start()
        self.result.operator_log = log_path
        self.say(f"  operator: {self.options.operator_cmd} (log {log_path})")

    def restart_operator(self) -> None:
        """Kill the operator (SIGKILL, as a crash) and start it again with the same command and log:
        procedural tests check that what it had begun (warnings, deadlines) survives."""
        if self._operator is None:
            raise SetupError("this run started no operator")
        self._operator.restart()
        self.say(f"  t={self.sim.elapsed() if self.sim else 0:.0f}s operator killed and restarted")

    def _publish_dra_devices(self) -> None:
        """ResourceSlices for nodes with dra (as the DRA driver's kubelet plugin would), and the DeviceClass."""
        dra_nodes = [(name, spec) for spec in self.scenario.nodes if spec.dra for name in spec.names]
        if not dra_nodes:
            return
        assert self.sim is not None
        custom: Any = client.CustomObjectsApi(self._api)
        try:
            custom.create_cluster_custom_object(
                "resource.k8s.io", "v1", "deviceclasses", manifests.device_class()
            )
        except ApiException as e:
            if e.status != 409:
                raise SetupError(
                    f"creating the DeviceClass failed: {e.status} {e.reason}: {_api_message(e)}"
                ) from None
        for name, spec in dra_nodes:
            uuids = [self.sim.uuid_of(name, i) for i in range(spec.gpus)]
            body = manifests.resource_slice(
                name, self._node_uids.get(name, ""), uuids, spec.gpu_model.product, self.name, self.run_id
            )
            self._create(
                partial(custom.create_cluster_custom_object, "resource.k8s.io", "v1", "resourceslices", body),
                f"ResourceSlice of {name}",
            )
        self._claims = ClaimPoller(self._api, self.sim.set_claims).start()

    def _create_workloads(self) -> None:
        for w in self.scenario.workloads:
            if w.start_at is None:
                self._create_workload(w)

    def _create_late_workloads(self, t: float) -> None:
        """Workloads with ``startAt`` are created once the scenario's clock passes it."""
        for w in self.scenario.workloads:
            if w.start_at is not None and w.name not in self._late_created and t >= seconds(w.start_at):
                self._late_created.add(w.name)
                self._create_workload(w)
                self.say(f"  [{t:6.1f}s] created {w.kind} {self.namespaces[w.namespace]}/{w.name} (startAt)")

    def _create_workload(self, w: WorkloadSpec) -> None:
        ns = self.namespaces[w.namespace]
        if w.pdb is not None:
            policy: Any = client.PolicyV1Api(self._api)
            body = manifests.pdb(w, w.pdb, ns, self.name, self.run_id)
            self._create(
                partial(policy.create_namespaced_pod_disruption_budget, ns, body), f"PDB {ns}/{w.name}"
            )
        apps: Any = client.AppsV1Api(self._api)
        batch: Any = client.BatchV1Api(self._api)
        core: Any = client.CoreV1Api(self._api)
        if w.dra and w.gpus:
            template = manifests.claim_template(w, ns, self.name, self.run_id)
            self._create(
                partial(
                    client.CustomObjectsApi(self._api).create_namespaced_custom_object,
                    "resource.k8s.io",
                    "v1",
                    ns,
                    "resourceclaimtemplates",
                    template,
                ),
                f"ResourceClaimTemplate {ns}/{w.name}-gpus",
            )
        create: dict[WorkloadKind, Any] = {
            WorkloadKind.POD: core.create_namespaced_pod,
            WorkloadKind.DEPLOYMENT: apps.create_namespaced_deployment,
            WorkloadKind.STATEFUL_SET: apps.create_namespaced_stateful_set,
            WorkloadKind.JOB: batch.create_namespaced_job,
        }
        body = manifests.workload(w, ns, self.name, self.run_id)
        self._create(partial(create[w.kind], ns, body), f"{w.kind} {ns}/{w.name}")

    # ---- observing -----------------------------------------------------------------------------

    def _observe(self) -> None:
        assert self.sim is not None
        give_up = self.tracker.deadline + 30.0
        while self.tracker.pending:
            t = self.sim.elapsed()
            if self._operator is not None and self._operator.exit_code is not None:
                why = f"the operator exited with code {self._operator.exit_code}"
                self.say(f"  {why}; last log lines:\n{_indent(self._operator.tail(1500))}")
                self._report(self.tracker.abandon(t, why))
                return
            self._create_late_workloads(t)
            obs = self._poll(t)
            update_histories(self.histories, obs.pods, obs.t)
            self._report(self.tracker.step(obs, self.names, self.histories))
            if t > give_up:
                self._report(self.tracker.abandon(t, "the run overran every deadline"))
                return
            time.sleep(max(0.0, self.options.poll_interval - (self.sim.elapsed() - t)))

    def _report(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            self.result.outcomes.append(o)
            self.say(f"{'PASS' if o.passed else 'FAIL'}  [{o.t:6.1f}s] {o.name}: {o.observed}")

    def _poll(self, t: float) -> Observation:
        core: Any = client.CoreV1Api(self._api)
        needs = self.tracker.needs()
        run = f"{manifests.RUN_LABEL}={self.run_id}"
        obs = Observation(t=t)
        obs.pods = _json(core.list_pod_for_all_namespaces(label_selector=run, _preload_content=False))[
            "items"
        ]
        if needs & {"nodeTainted", "nodeNotTainted", "nodeCondition"}:
            nodes = _json(core.list_node(label_selector=run, _preload_content=False))["items"]
            obs.nodes = {n["metadata"]["name"]: n for n in nodes}
        if needs & {"policyCondition", "policyStatus"}:
            custom: Any = client.CustomObjectsApi(self._api)
            policies = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector=run)["items"]
            obs.policies = {p["metadata"]["name"]: p for p in policies}
        if "event" in needs:
            obs.events = self._events(core)
        for query in self.tracker.queries():
            obs.queries[query] = self._query(self.expand(query))
        if "workloadObject" in needs:
            obs.workloads = self._workload_objects()
        return obs

    def _workload_objects(self) -> dict[tuple[str, str], dict[str, Any] | None]:
        """Each controller workload's own object (None when it is gone)."""
        apps: Any = client.AppsV1Api(self._api)
        batch: Any = client.BatchV1Api(self._api)
        read = {
            WorkloadKind.DEPLOYMENT: apps.read_namespaced_deployment,
            WorkloadKind.STATEFUL_SET: apps.read_namespaced_stateful_set,
            WorkloadKind.JOB: batch.read_namespaced_job,
        }
        out: dict[tuple[str, str], dict[str, Any] | None] = {}
        for w in self.scenario.workloads:
            if w.kind not in read:
                continue
            namespace, name = self.names.workload(w.name)
            try:
                out[(namespace, name)] = _json(read[w.kind](name, namespace, _preload_content=False))
            except ApiException as exc:
                if exc.status != 404:
                    raise
                out[(namespace, name)] = None
        return out

    def expand(self, query: str) -> str:
        """PromQL templates: ${ns:NAME} is scenario namespace NAME as created, ${target} this run's target
        label (simulator="..."), ${run} the run id, ${scenario} the scenario name."""

        def one(match: re.Match[str]) -> str:
            key, _, arg = match.group(1).partition(":")
            if key == "ns" and arg in self.namespaces:
                return self.namespaces[arg]
            values = {"target": self.target_name, "run": self.run_id, "scenario": self.name}
            return values.get(key, match.group(0))

        return re.sub(r"\$\{([a-z]+(?::[a-z0-9-]+)?)\}", one, query)

    def _events(self, core: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for ns in sorted(set(self.namespaces.values())):
            events += _json(core.list_namespaced_event(ns, _preload_content=False))["items"]
        for kind in ("Node", "GPUEfficiencyPolicy"):
            events += _json(
                core.list_event_for_all_namespaces(
                    field_selector=f"involvedObject.kind={kind}", _preload_content=False
                )
            )["items"]
        return events_since(events, self._since)

    def _query(self, query: str) -> list[tuple[dict[str, str], float]] | str:
        """The series of an instant (vector) query, or why there are none (the expectation shows it)."""
        try:
            return self.prometheus.query(query)
        except SourceUnavailable as e:
            return str(e)

    # ---- teardown ------------------------------------------------------------------------------

    def _teardown(self) -> None:
        try:
            if self._api is not None and not self.options.keep:
                self._delete_all(
                    list(self._created_policies),
                    list(self._created_namespaces),
                    list(self._created_nodes),
                    wait=False,
                )
            elif self.options.keep:
                self.say(
                    f"  kept the objects; remove them with: gpu-efficiency-sim cleanup {self.loaded.path}"
                )
        except ApiException as e:
            self.say(f"  WARNING cleanup failed: {e.status} {e.reason}: {_api_message(e)}")
        finally:
            if self._operator is not None:
                self._operator.stop()
                if not self.result.passed:
                    self.say(f"  operator log: {self._operator.log_path}")
            if self._targets_file is not None:
                unregister(self._targets_file)
            if self._watcher is not None:
                self._watcher.stop()
            if self._claims is not None:
                self._claims.stop()
            for server in self._servers:
                server.stop()

    def _delete_all(
        self, policies: list[str], namespaces: list[str], nodes: list[str], *, wait: bool
    ) -> None:
        delete_objects(self._api, policies, namespaces, nodes, wait=wait)


def delete_objects(
    api: Any, policies: list[str], namespaces: list[str], nodes: list[str], *, wait: bool
) -> None:
    """Delete what a run created: policies first (while an operator can still drop its finalizers), then
    pods without grace, namespaces and nodes. Finalizers still on a policy after 15s are removed."""
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    for name in policies:
        _ignore_404(partial(custom.delete_cluster_custom_object, GROUP, VERSION, PLURAL, name))
    deadline = time.monotonic() + 15
    remaining = list(policies)
    while remaining and time.monotonic() < deadline:
        remaining = [
            n
            for n in remaining
            if _exists(partial(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, n))
        ]
        if remaining:
            time.sleep(0.5)
    for name in remaining:
        _ignore_404(
            partial(
                custom.patch_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                name,
                {"metadata": {"finalizers": None}},
            )
        )
    for ns in namespaces:
        _ignore_404(partial(core.delete_collection_namespaced_pod, ns, grace_period_seconds=0))
        _ignore_404(partial(core.delete_namespace, ns))
    for name in nodes:
        _ignore_404(partial(core.delete_node, name))
    if wait:
        deadline = time.monotonic() + 120
        pending = list(namespaces)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if _exists(partial(core.read_namespace, n))]
            if pending:
                time.sleep(1.0)
        if pending:
            raise SetupError(f"namespace(s) {', '.join(pending)} still terminating after 120s")


def cleanup_scenario(path: Path | str, kubeconfig: str | None = None, *, all_runs: bool = False) -> int:
    """Delete every object left by runs of this scenario (or of every scenario); return how many."""
    api = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    selector = f"{manifests.MANAGED_BY_KEY}={manifests.MANAGED_BY}"
    if not all_runs:
        selector += f",{manifests.SCENARIO_LABEL}={load_scenario(path).name}"
    nodes = [
        n["metadata"]["name"]
        for n in _json(core.list_node(label_selector=selector, _preload_content=False))["items"]
    ]
    namespaces = [
        n["metadata"]["name"]
        for n in _json(core.list_namespace(label_selector=selector, _preload_content=False))["items"]
    ]
    try:
        policies = [
            p["metadata"]["name"]
            for p in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector=selector)[
                "items"
            ]
        ]
    except ApiException as e:
        if e.status != 404:
            raise
        policies = []
    delete_objects(api, policies, namespaces, nodes, wait=False)
    return len(nodes) + len(namespaces) + len(policies)


def _ignore_404(call: Callable[[], Any]) -> None:
    try:
        call()
    except ApiException as e:
        if e.status != 404:
            raise


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _api_message(e: ApiException) -> str:
    try:
        return str(orjson.loads(e.body or b"{}").get("message") or e.body)
    except (orjson.JSONDecodeError, AttributeError):
        return str(e.body)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


__all__ = ["RunOptions", "ScenarioResult", "cleanup_scenario", "run_scenario"]
