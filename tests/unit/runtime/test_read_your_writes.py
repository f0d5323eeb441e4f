"""Our writes come back to the reader (read-your-writes for the watch cache), and the operator's
long-running path uses the cache while one-shot commands and --no-watch-cache LIST."""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from kubernetes import client
from tests.unit.actuators.test_nodes import FakeCore, make_node

from gpu_efficiency.actuators import nodes
from gpu_efficiency.actuators.apply import Applier
from gpu_efficiency.actuators.pods import annotate_pod
from gpu_efficiency.config import OperatorConfig, add_setting_arguments, config_from_args
from gpu_efficiency.engine.model import AnnotateNode, AnnotatePod, EvictPod, PodEvent, TaintNode
from gpu_efficiency.engine.outcomes import Outcome, Result
from gpu_efficiency.runtime.deps import build_reader, feed_write
from gpu_efficiency.sources.kube.cluster import ClusterReader, node_view
from gpu_efficiency.sources.kube.cluster_cache import CachedClusterReader


class RecordingReader(ClusterReader):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def pod_written(self, obj: Any) -> None:
        self.seen.append(("pod", obj["metadata"]["name"]))

    def node_written(self, obj: Any) -> None:
        self.seen.append(("node", obj["metadata"]["name"]))

    def pod_evicted(self, uid: str) -> None:
        self.seen.append(("evicted", uid))


def test_feed_writes_hands_back_what_each_write_returned() -> None:
    reader = RecordingReader()
    evict = EvictPod(namespace="ns", name="idle", uid="u-idle", reason="idle for 1h")
    outcomes = [
        Outcome(
            AnnotatePod(namespace="ns", name="p", uid="u-p", annotations={"k": "v"}),
            Result.DONE,
            obj={"metadata": {"name": "p"}},
        ),
        Outcome(AnnotatePod(namespace="ns", name="gone", uid="u-g", annotations={"k": "v"}), Result.SKIPPED),
        Outcome(
            TaintNode(node="n1", kind="ecc", effect="NoSchedule"),
            Result.DONE,
            obj={"metadata": {"name": "n1"}},
        ),
        Outcome(evict, Result.DONE),
        Outcome(
            EvictPod(namespace="ns", name="pdb", uid="u-pdb", reason="idle"),
            Result.BLOCKED,
            obj={"metadata": {"name": "pdb"}},
        ),
        Outcome(PodEvent(namespace="ns", name="p", uid="u-p", reason="GPUIdle", message="idle"), Result.DONE),
    ]
    for outcome in outcomes:
        feed_write(reader, outcome)
    assert reader.seen == [("pod", "p"), ("node", "n1"), ("evicted", "u-idle"), ("pod", "pdb")]


class _PodCore:
    def __init__(self, returned: dict[str, Any]) -> None:
        self.returned = returned
        self.kwargs: dict[str, Any] = {}

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any:
        self.kwargs = kwargs

        class Response:
            data = orjson.dumps(self.returned)

        return Response()


def test_annotate_pod_returns_the_patched_pod_as_json() -> None:
    returned = {"metadata": {"name": "p", "uid": "u", "resourceVersion": "9", "annotations": {"k": "v"}}}
    core = _PodCore(returned)
    outcome = annotate_pod(core, AnnotatePod(namespace="ns", name="p", uid="u", annotations={"k": "v"}))  # type: ignore[arg-type]
    assert outcome.result is Result.DONE
    assert outcome.obj == returned
    assert core.kwargs["_preload_content"] is False
    assert outcome == Outcome(outcome.action, Result.DONE)  # the object is not part of equality


def test_node_writes_return_the_node_as_api_json() -> None:
    core = FakeCore(make_node("n1"))
    outcome = nodes.apply_taint(core, TaintNode(node="n1", kind="ecc", effect="NoSchedule"))
    assert outcome.result is Result.DONE
    assert outcome.obj is not None
    view = node_view(outcome.obj)
    assert [(t.key, t.value, t.effect) for t in view.taints] == [
        ("gpuefficiency.io/gpu-fault", "ecc", "NoSchedule")
    ]
    assert outcome.obj["metadata"]["resourceVersion"] == "2"
    annotated = nodes.annotate_node(core, AnnotateNode(node="n1", annotations={"gpuefficiency.io/x": "1"}))
    assert annotated.obj is not None
    assert node_view(annotated.obj).annotations == {"gpuefficiency.io/x": "1"}
    assert nodes.as_json(object()) is None


def test_the_applier_hands_each_write_over_as_it_happens_and_keeps_no_json() -> None:
    """A first cycle patches thousands of pods: their JSON goes to the cache at once, not kept."""
    returned = {"metadata": {"name": "p", "uid": "u", "resourceVersion": "9"}}
    seen: list[Outcome] = []
    applier = Applier(api_client=client.ApiClient(), recorder=None, on_written=seen.append)  # type: ignore[arg-type]
    applier.core = _PodCore(returned)  # type: ignore[assignment]
    outcomes = applier.apply(
        [AnnotatePod(namespace="ns", name="p", uid="u", annotations={"k": "v"})],
        policy_name="pol",
        policy_uid="x",
    )
    assert [o.obj for o in seen] == [returned]
    assert [o.result for o in outcomes] == [Result.DONE]
    assert outcomes[0].obj is None


def _config(*argv: str) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    return config_from_args(parser.parse_args(list(argv)))


def test_the_watch_cache_is_on_for_run_off_for_one_shot_commands_and_by_flag() -> None:
    api = client.ApiClient()
    assert _config().watch_cache
    assert isinstance(build_reader(_config(), api, watch=True), CachedClusterReader)
    assert type(build_reader(_config(), api, watch=False)) is ClusterReader  # report, explain
    assert type(build_reader(_config("--no-watch-cache"), api, watch=True)) is ClusterReader


def test_the_watch_cache_switch_reads_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("GPUEFF_WATCH_CACHE", "0")
    assert not _config().watch_cache
    assert _config("--watch-cache").watch_cache
