"""Kubernetes objects built from a scenario."""

from __future__ import annotations

from gpu_efficiency_sim import manifests
from gpu_efficiency_sim.scenario import parse_scenario

SCENARIO = parse_scenario(
    """
name: demo
nodes:
  - {name: gpu-a, gpus: 4, model: NVIDIA-L4, labels: {zone: z1}, taints: [{key: dedicated, value: ml}]}
workloads:
  - name: train
    namespace: team
    kind: Job
    replicas: 3
    gpus: 2
    node: gpu-a
    nodeSelector: {zone: z1}
    tolerations: [{key: dedicated, operator: Exists}]
    pdb: {maxUnavailable: 1}
    annotations: {gpuefficiency.io/exempt: "true"}
    labels: {team: a}
    priorityClassName: high
    terminationGracePeriodSeconds: 3
  - {name: web, namespace: team, kind: StatefulSet, replicas: 2, gpus: 0}
  - {name: nb, namespace: team, kind: Pod}
  - {name: svc, namespace: team, kind: Deployment, replicas: 2}
"""
).scenario


def test_fake_gpu_node_has_kwok_annotation_gfd_labels_and_gpu_capacity() -> None:
    spec = SCENARIO.nodes[0]
    node = manifests.node("gpu-a", spec, "demo", "r1")
    meta = node["metadata"]
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    labels = meta["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "23034"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["kubernetes.io/hostname"] == "gpu-a"
    assert labels["type"] == "kwok"
    assert labels["zone"] == "z1"
    assert labels["sim.gpuefficiency.io/scenario"] == "demo"
    assert labels["sim.gpuefficiency.io/run"] == "r1"
    assert (
        node["status"]["capacity"]["nvidia.com/gpu"] == "4" == node["status"]["allocatable"]["nvidia.com/gpu"]
    )
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        {"key": "sim.gpuefficiency.io/scenario", "value": "demo", "effect": "NoSchedule"},
    ], "the scenario's own taints, plus the isolation taint its pods tolerate"
    bare = manifests.node("gpu-a", spec.model_copy(update={"taints": []}), "demo", "r1", isolate=False)
    assert bare["spec"] == {}


def test_job_pods_request_gpus_on_the_scenario_node_with_the_workload_label() -> None:
    job = manifests.workload(SCENARIO.workloads[0], "pre-team", "demo", "r1")
    assert (job["kind"], job["metadata"]["namespace"]) == ("Job", "pre-team")
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    template = job["spec"]["template"]
    assert template["metadata"]["labels"]["sim.gpuefficiency.io/workload"] == "train"
    assert template["metadata"]["labels"]["team"] == "a"
    assert template["metadata"]["annotations"] == {"gpuefficiency.io/exempt": "true"}
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {
        "sim.gpuefficiency.io/scenario": "demo",
        "zone": "z1",
        "kubernetes.io/hostname": "gpu-a",
    }
    container = spec["containers"][0]
    assert container["image"] == "registry.k8s.io/pause:3.10"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert (spec["priorityClassName"], spec["terminationGracePeriodSeconds"]) == ("high", 3)
    assert spec["tolerations"] == [
        {
            "key": "sim.gpuefficiency.io/scenario",
            "operator": "Equal",
            "value": "demo",
            "effect": "NoSchedule",
        },
        {"key": "dedicated", "operator": "Exists"},
    ]


def test_other_kinds() -> None:
    sts = manifests.workload(SCENARIO.workloads[1], "team", "demo", "r1")
    assert sts["kind"] == "StatefulSet"
    assert sts["spec"]["serviceName"] == "web"
    assert "nvidia.com/gpu" not in sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    pod = manifests.workload(SCENARIO.workloads[2], "team", "demo", "r1")
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["labels"]["sim.gpuefficiency.io/workload"] == "nb"
    deploy = manifests.workload(SCENARIO.workloads[3], "team", "demo", "r1")
    assert deploy["spec"]["selector"] == {"matchLabels": {"sim.gpuefficiency.io/workload": "svc"}}


def test_pdb_selects_the_workload() -> None:
    w = SCENARIO.workloads[0]
    assert w.pdb is not None
    pdb = manifests.pdb(w, w.pdb, "team", "demo", "r1")
    assert pdb["spec"] == {
        "selector": {"matchLabels": {"sim.gpuefficiency.io/workload": "train"}},
        "maxUnavailable": 1,
    }


def test_policies_are_scoped_to_the_scenario_unless_they_select_themselves() -> None:
    scoped = manifests.policy("p", {"mode": "Enforce"}, "demo", "r1", scope=True)
    selection = scoped["spec"]["selection"]
    assert selection["namespaceSelector"] == {"matchLabels": {"sim.gpuefficiency.io/scenario": "demo"}}
    assert selection["nodeSelector"] == {"matchLabels": {"sim.gpuefficiency.io/scenario": "demo"}}
    assert scoped["apiVersion"] == "gpuefficiency.io/v1alpha1"
    assert scoped["kind"] == "GPUEfficiencyPolicy"
    own = {
        "selection": {
            "namespaceSelector": {"matchLabels": {"x": "y"}},
            "excludedNamespaces": ["team", "kube-x"],
        }
    }
    kept = manifests.policy(
        "p", own, "demo", "r1", scope=True, namespace_prefix="t1-", scenario_namespaces=("team",)
    )
    assert kept["spec"]["selection"]["namespaceSelector"] == {"matchLabels": {"x": "y"}}
    assert kept["spec"]["selection"]["excludedNamespaces"] == ["t1-team", "kube-x"]
    assert own["selection"]["excludedNamespaces"] == ["team", "kube-x"], "the input is not modified"
    unscoped = manifests.policy("p", {"mode": "Observe"}, "demo", "r1", scope=False)
    assert "selection" not in unscoped["spec"]
