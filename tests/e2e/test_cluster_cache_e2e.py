"""The watch-based cluster cache on the real API server, with the chart's RBAC (a missing ``watch``
verb fails here): it syncs, follows pods, nodes, namespaces, ResourceSlices and our DeviceTaintRules
within seconds, survives the server ending its watches and a resume from an old version, and the
operator's steady cycles make no API read (while ``--no-watch-cache`` LISTs every cycle), nor with
an idle pod in Observe mode past ``idleFor`` (its owners were LISTed every cycle for a warning that
Observe never gives)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import metrics
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine.model import DraDevice
from gpu_efficiency.objects.dra import RULE_VERSION, SLICE_VERSION, rule_body
from gpu_efficiency.sources.kube.cluster import ClusterReader, ClusterState
from gpu_efficiency.sources.kube.cluster_cache import CachedClusterReader, ClusterCache
from gpu_efficiency.sources.kube.dra import DraReader
from gpu_efficiency.sources.kube.dra_cache import DraCache, WatchedDraReader
from tests.e2e.harness import Cluster, OperatorIdentity, OperatorProcess, wait_for
from tests.e2e.scenario_driver import BackgroundScenario

#: How soon a change must show in the cache. A healthy watch delivers in milliseconds; this leaves
#: room for a loaded 2-core machine. The measured delays are printed.
DELIVERY_S = 5.0
MARK = "example.com/cache-e2e"


@pytest.fixture
def operator_api(operator_identity: OperatorIdentity) -> client.ApiClient:
    """The operator's own credentials: the chart's ClusterRole, nothing more."""
    return kube_config.new_client_from_config(config_file=operator_identity.kubeconfig)


@pytest.fixture
def caches(operator_api: client.ApiClient) -> Iterator[Callable[..., CachedClusterReader]]:
    started: list[CachedClusterReader] = []

    def make(**options: Any) -> CachedClusterReader:
        reader = CachedClusterReader(ClusterCache(operator_api, **options), ClusterReader(operator_api))
        reader.start()
        started.append(reader)
        assert reader.cache.wait_synced(30), "the cache did not sync (is `watch` in the ClusterRole?)"
        return reader

    yield make
    for reader in started:
        reader.stop()


def gpu_node(core: client.CoreV1Api) -> str:
    nodes = core.list_node(label_selector="nvidia.com/gpu.present=true").items
    assert nodes, "no fake GPU nodes"
    return str(sorted(n.metadata.name for n in nodes)[0])


def bare_pod(namespace: str, name: str, node: str, gpus: int) -> client.V1Pod:
    limits = {names.GPU_RESOURCE: str(gpus)} if gpus else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1PodSpec(
            node_name=node,  # bound directly: no scheduler in the way
            termination_grace_period_seconds=0,
            tolerations=[client.V1Toleration(operator="Exists")],
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.k8s.io/pause:3.10",
                    resources=client.V1ResourceRequirements(limits=limits),
                )
            ],
        ),
    )


def delivered(what: str, probe: Callable[[], bool], timeout: float = DELIVERY_S) -> float:
    """Seconds until ``probe`` holds (polled every 20 ms); fails after ``timeout``."""
    t0 = time.monotonic()
    wait_for(lambda: probe() or None, timeout, interval=0.02, what=what)
    took = time.monotonic() - t0
    print(f"cache: {what} after {took * 1000:.0f} ms")
    return took


def _set_mark_taint(core: client.CoreV1Api, node: str, present: bool) -> None:
    """Add or remove our test taint by read-modify-write with the resourceVersion (spec.taints is atomic)."""
    for _ in range(10):
        obj = core.read_node(node)
        taints = [t for t in (obj.spec.taints or []) if t.key != MARK]
        if present:
            taints.append(client.V1Taint(key=MARK, value="1", effect="PreferNoSchedule"))
        body = {
            "metadata": {"resourceVersion": obj.metadata.resource_version},
            "spec": {"taints": [client.ApiClient().sanitize_for_serialization(t) for t in taints]},
        }
        try:
            core.patch_node(node, body)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"could not update the taints of {node}")


def test_cache_syncs_with_the_charts_rbac_and_follows_changes_within_seconds(
    k8s: client.ApiClient, namespace: str, caches: Callable[..., CachedClusterReader]
) -> None:
    core = client.CoreV1Api(k8s)
    node = gpu_node(core)
    reader = caches()
    state = reader.read()
    assert state.requests == 0
    assert node in {n.name for n in state.nodes}
    assert namespace in {n.name for n in state.namespaces}

    def pod_view(name: str) -> Any:
        return next((p for p in reader.read().pods if (p.namespace, p.name) == (namespace, name)), None)

    delays = []
    core.create_namespaced_pod(namespace, bare_pod(namespace, "cpu-only", node, gpus=0))
    core.create_namespaced_pod(namespace, bare_pod(namespace, "trainer", node, gpus=1))
    delays.append(delivered("GPU pod created", lambda: pod_view("trainer") is not None))
    uid = pod_view("trainer").uid
    # A user's acknowledgement (ours: kept in the view) next to a foreign annotation (dropped).
    ack = {names.KEEP_UNTIL: "2030-01-01T00:00:00Z", MARK: "seen"}
    core.patch_namespaced_pod("trainer", namespace, {"metadata": {"annotations": ack}})
    delays.append(
        delivered(
            "pod annotated",
            lambda: pod_view("trainer").annotations.get(names.KEEP_UNTIL) == ack[names.KEEP_UNTIL],
        )
    )
    assert MARK not in pod_view("trainer").annotations
    delays.append(delivered("pod Running", lambda: pod_view("trainer").phase == "Running", timeout=30))
    assert pod_view("cpu-only") is None  # no GPU: never cached

    def taint_values() -> list[str]:
        view = next(n for n in reader.read().nodes if n.name == node)
        return [t.value for t in view.taints if t.key == MARK]

    try:
        _set_mark_taint(core, node, present=True)
        delays.append(delivered("node tainted", lambda: taint_values() == ["1"]))
    finally:
        _set_mark_taint(core, node, present=False)
    delays.append(delivered("node untainted", lambda: taint_values() == []))

    core.patch_namespace(namespace, {"metadata": {"labels": {MARK.replace("/", "-"): "yes"}}})
    delays.append(
        delivered(
            "namespace labelled",
            lambda: any(
                n.name == namespace and n.labels.get(MARK.replace("/", "-")) == "yes"
                for n in reader.read().namespaces
            ),
        )
    )
    core.delete_namespaced_pod("trainer", namespace, grace_period_seconds=0)
    delays.append(delivered("pod deleted", lambda: pod_view("trainer") is None, timeout=30))
    assert all(p.uid != uid for p in reader.read().pods)
    assert reader.read().requests == 0
    assert reader.cache.bound.relists == 1  # one LIST at start, then only the watch


def test_dra_watches_sync_with_the_charts_rbac_and_follow_slices_and_rules_within_seconds(
    k8s: client.ApiClient, operator_api: client.ApiClient
) -> None:
    """A new slice and an admin's deletion of our rule show without a LIST (DraReader saw a slice
    up to a minute late and LISTed our rules every cycle)."""
    custom: Any = client.CustomObjectsApi(k8s)
    tag = uuid.uuid4().hex[:6]
    gpu = DraDevice(
        "cache-e2e.example.com", f"cache-e2e-{tag}", "gpu-0", gpu_node(client.CoreV1Api(k8s)), f"GPU-{tag}"
    )
    slice_body = {
        "apiVersion": f"resource.k8s.io/{SLICE_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": gpu.pool},
        "spec": {
            "driver": gpu.driver,
            "nodeName": gpu.node,
            "pool": {"name": gpu.pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": gpu.device, "attributes": {"uuid": {"string": gpu.uuid}}}],
        },
    }
    rule = rule_body("xid", "NoSchedule", gpu)  # a device no class selects: it quarantines nothing
    reader = WatchedDraReader(
        DraCache.for_client(operator_api), DraReader(client.CustomObjectsApi(operator_api))
    )
    reader.start()
    try:
        for informer in reader.cache.informers:
            assert informer.wait_synced(30), (
                f"{informer.resource} did not sync: is `watch` in the ClusterRole, and "
                f"resource.k8s.io/v1beta2 served? ({informer.error})"
            )
        assert not reader.read().error
        custom.create_cluster_custom_object("resource.k8s.io", SLICE_VERSION, "resourceslices", slice_body)
        delivered("ResourceSlice created", lambda: gpu in reader.read().devices)
        custom.create_cluster_custom_object("resource.k8s.io", RULE_VERSION, "devicetaintrules", rule)
        name = rule["metadata"]["name"]
        delivered("our DeviceTaintRule created", lambda: any(r.name == name for r in reader.read().rules))
        custom.delete_cluster_custom_object("resource.k8s.io", RULE_VERSION, "devicetaintrules", name)
        delivered(
            "our DeviceTaintRule deleted by an admin",
            lambda: all(r.name != name for r in reader.read().rules),
        )
        assert reader.requests == 0
    finally:
        reader.stop()
        for version, plural, obj in (
            (RULE_VERSION, "devicetaintrules", rule),
            (SLICE_VERSION, "resourceslices", slice_body),
        ):
            try:
                custom.delete_cluster_custom_object(
                    "resource.k8s.io", version, plural, obj["metadata"]["name"]
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _cache_matches_a_list(reader: CachedClusterReader) -> bool:
    listed = ClusterReader(reader.fallback.core.api_client).read()
    cached = reader.read()
    return (
        {p.uid: p.annotations for p in cached.pods} == {p.uid: p.annotations for p in listed.pods}
        and {n.name for n in cached.nodes} == {n.name for n in listed.nodes}
        and {n.name for n in cached.namespaces} == {n.name for n in listed.namespaces}
    )


def test_cache_survives_server_side_stream_ends_and_a_resume_from_an_old_version(
    k8s: client.ApiClient, namespace: str, caches: Callable[..., CachedClusterReader]
) -> None:
    core = client.CoreV1Api(k8s)
    node = gpu_node(core)
    # The API server ends every watch after 3-4 s (with a bookmark 2 s before its deadline).
    reader = caches(watch_seconds=(3, 4))
    wait_for(lambda: reader.cache.bound.watches >= 4 or None, 30, what="the server to end several watches")
    core.create_namespaced_pod(namespace, bare_pod(namespace, "after-ends", node, gpus=1))
    delivered(
        "pod created across stream ends",
        lambda: any(p.name == "after-ends" for p in reader.read().pods),
    )
    assert reader.cache.bound.relists == 1, "a watch the server ended must resume, not relist"

    # Resume from resourceVersion 1: the server answers 410 Gone (we relist) or, while its watch
    # cache still reaches that far back, replays history; either way the cache must converge.
    for informer in reader.cache.informers:
        informer.restart_watch(from_version="1")
    core.create_namespaced_pod(namespace, bare_pod(namespace, "after-resume", node, gpus=1))
    core.delete_namespaced_pod("after-ends", namespace, grace_period_seconds=0)
    wait_for(lambda: _cache_matches_a_list(reader) or None, 30, what="the cache to match a fresh LIST")
    print("relists after resuming from version 1:", {i.resource: i.relists for i in reader.cache.informers})
    assert any(p.name == "after-resume" for p in reader.read().pods)
    assert not any(p.name == "after-ends" for p in reader.read().pods)
    assert reader.read().requests == 0


def test_cache_notices_a_watch_the_server_never_serves_lists_meanwhile_and_relists(
    k8s: client.ApiClient, namespace: str, caches: Callable[..., CachedClusterReader]
) -> None:
    """A resourceVersion the server has not reached (as after an etcd restore) is accepted and never
    answered. The cache must not be read meanwhile (cycles LIST), and it relists."""
    core = client.CoreV1Api(k8s)
    # Short watches: a served one ends with its pre-deadline bookmark, an unserved one empty.
    reader = caches(watch_seconds=(3, 4), max_broken=2.0)
    pods = reader.cache.bound
    wait_for(lambda: pods.watches >= 2 or None, 30, what="a served watch to end and resume")
    assert pods.relists == 1
    pods.restart_watch(from_version=str(int(pods.resource_version or "0") + 10**9))
    core.create_namespaced_pod(namespace, bare_pod(namespace, "while-stalled", gpu_node(core), gpus=1))
    # The pods' own LIST, counted by resource: in a quiet cluster the other short watches (nodes,
    # pending pods) may end empty too (no write, so no bookmark), and their LIST must not pass for
    # the pods being LISTed (it did once: the pending-pods LIST made requests > 0 while the pods
    # still came from the stalled cache).
    nothing = ClusterState(pods=(), nodes=(), namespaces=(), requests=0)

    def pods_listed() -> ClusterState | None:
        before = _fallbacks("pods")
        state = reader.read_pods(nothing)
        return state if _fallbacks("pods") > before else None

    listed = wait_for(
        pods_listed, 30, interval=0.02, what="cycles to LIST the pods while their watch is not served"
    )
    assert any(p.name == "while-stalled" for p in listed.pods)
    wait_for(lambda: pods.relists >= 2 or None, 30, what="a relist after two silent watches")
    delivered(
        "pod seen by the relisted cache",
        lambda: any(p.name == "while-stalled" for p in reader.cache.pods.snapshot() or ()),
    )


def _fallbacks(resource: str) -> float:
    """How many cycle reads LISTed ``resource`` because its cache was not usable (this process)."""
    value = metrics.REGISTRY.get_sample_value(
        "gpu_efficiency_cache_fallback_lists_total", {"resource": resource}
    )
    return value or 0.0


# ---- the operator process ----------------------------------------------------------------------


READS = re.compile(r"policy (\S+): cycle [^\n]*?, (\d+) API reads")


def _reads(op: OperatorProcess, policy: str) -> list[int]:
    return [int(m.group(2)) for m in READS.finditer(op.log()) if m.group(1) == policy]


@pytest.fixture
def policy(k8s: client.ApiClient, namespace: str) -> Iterator[str]:
    name = f"cache-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUEfficiencyPolicy",
        "metadata": {"name": name},
        "spec": {
            "interval": "2s",
            "window": "10s",
            "metrics": {"prometheus": {"scrapeInterval": "1s"}},
            "selection": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            "faults": {"enabled": False},
        },
    }
    custom = client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    yield name
    try:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_operator_steady_cycles_make_no_api_reads_and_the_switch_turns_the_cache_off(
    start_operator: Callable[..., OperatorProcess], policy: str
) -> None:
    op = start_operator()
    wait_for(lambda: len(_reads(op, policy)) >= 3 or None, 120, what="three cycles of the operator")
    reads = _reads(op, policy)
    print("API reads per cycle with the cache:", reads)
    assert reads[-2:] == [0, 0]
    assert "cache synced" in op.log()
    op.stop()

    listing = start_operator("--no-watch-cache")
    wait_for(lambda: len(_reads(listing, policy)) >= 2 or None, 120, what="two cycles without the cache")
    reads = _reads(listing, policy)
    print("API reads per cycle without the cache:", reads)
    assert all(r >= 3 for r in reads)  # pods, nodes and namespaces LISTed every cycle


CYCLE = re.compile(
    r"policy (\S+): cycle [\d.]+s, \d+ verdicts, \d+ actions, (\d+) writes, \d+ queries, (\d+) API reads"
)


def _cycles(log: Path | None, policy: str) -> list[tuple[int, int]]:
    """(writes, API reads) of each of ``policy``'s cycles so far, from the operator's log."""
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    return [(int(m.group(2)), int(m.group(3))) for m in CYCLE.finditer(text) if m.group(1) == policy]


def test_observe_cycles_with_an_idle_pod_past_idle_for_make_no_api_read_and_no_write(
    cluster: Cluster, k8s: client.ApiClient, operator_identity: OperatorIdentity, tmp_path: Path
) -> None:
    """An idle Deployment's pod in Observe mode, idle longer than ``idleFor`` on an unchanged
    cluster: the owners read when its clock started serve (Observe never warns, so no cycle needs
    them afresh), and every later cycle makes 0 API reads and 0 writes. Before, each such cycle
    LISTed the owner kinds, HPAs and PodDisruptionBudgets (and, once a minute, the CRD owners'
    discovery): 7-15 reads a cycle in the 300-node benchmark."""
    policy, idle_for_s, interval_s = "steady-observe", 5.0, 3.0
    core = client.CoreV1Api(k8s)
    with BackgroundScenario(policy, cluster, operator_identity, tmp_path) as bg:
        ns = bg.namespace("sim-steady")

        def idle_since() -> float | None:
            pods = core.list_namespaced_pod(ns).items
            annotations = (pods[0].metadata.annotations or {}) if len(pods) == 1 else {}
            if annotations.get(names.STATE) != "Idle":
                return None
            return parse_rfc3339(annotations.get(names.IDLE_SINCE))

        since = wait_for(idle_since, 60, what="the idle Deployment's pod judged Idle")
        # One whole cycle after idleFor has passed: from then on only a warning could need owners.
        time.sleep(max(0.0, since + idle_for_s + interval_s + 1.0 - time.time()))
        log = bg.run.result.operator_log
        before = len(_cycles(log, policy))
        steady = wait_for(
            lambda: (c := _cycles(log, policy)[before:]) and len(c) >= 4 and c,
            60,
            what="four cycles past idleFor",
        )
        print("(writes, API reads) of every cycle:", _cycles(log, policy))
        assert any(reads > 0 for _, reads in _cycles(log, policy)[:before]), (
            "the owners were never read (the idle annotation needs them once): is the counter counting?"
        )
        assert steady == [(0, 0)] * len(steady), f"steady Observe cycles (writes, API reads): {steady}"
        annotations = core.list_namespaced_pod(ns).items[0].metadata.annotations or {}
        assert names.EVICT_AFTER not in annotations, "Observe mode warned"
    result = bg.finish()
    assert result.passed, bg.report()
