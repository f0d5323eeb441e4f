"""KubeRay, Kubeflow training and Kueue objects as the owner source reads them: each kind's suspend
switch, Kueue's queue label, the Workload's controller (the job it admits), the RayJobs KubeRay would
refuse to suspend, and Workloads read at the first API version served."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpu_efficiency.engine.model import OwnerRef
from gpu_efficiency.sources.kube.owners import OwnerReader

from .test_owner_reader import FakeApi, builtin, meta


def served(docs: dict[str, Any], api_version: str, plural: str, items: list[dict[str, Any]]) -> None:
    docs.setdefault(f"/apis/{api_version}", {"resources": []})["resources"].append({"name": plural})
    docs[f"/apis/{api_version}/{plural}"] = {"items": items}


def test_each_kind_is_read_with_its_own_suspend_switch() -> None:
    docs = builtin()
    served(docs, "ray.io/v1", "rayclusters", [
        {"metadata": meta("rc-on"), "spec": {}},
        {"metadata": meta("rc-off"), "spec": {"suspend": True}},
    ])  # fmt: skip
    served(docs, "kubeflow.org/v1", "pytorchjobs", [
        {"metadata": meta("pt-off"), "spec": {"runPolicy": {"suspend": True}}},
        {"metadata": meta("pt-odd"), "spec": {"suspend": True}},  # not where training-operator reads it
    ])  # fmt: skip
    served(docs, "kubeflow.org/v1", "mpijobs", [{"metadata": meta("mpi"), "spec": {"runPolicy": {}}}])
    served(
        docs,
        "kubeflow.org/v1",
        "tfjobs",
        [{"metadata": meta("tf"), "spec": {"runPolicy": {"suspend": True}}}],
    )
    served(
        docs,
        "trainer.kubeflow.org/v1alpha1",
        "trainjobs",
        [{"metadata": meta("tj"), "spec": {"suspend": True}}],
    )
    objects = OwnerReader(FakeApi(docs)).read().objects
    suspended = {name: o.suspended for (_, _, name), o in objects.items()}
    assert suspended == {
        "rc-on": False, "rc-off": True, "pt-off": True, "pt-odd": False, "mpi": False, "tf": True, "tj": True,
    }  # fmt: skip
    assert objects[("ml", "TrainJob", "tj")].ref == OwnerRef(
        "trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", "uid-tj"
    )


def test_a_rayjob_kuberay_would_not_suspend_says_why() -> None:
    docs = builtin()
    served(docs, "ray.io/v1", "rayjobs", [
        {"metadata": meta("ok"), "spec": {"shutdownAfterJobFinishes": True}},
        {"metadata": meta("keeps-cluster"), "spec": {}},
        {"metadata": meta("borrowed"), "spec": {"shutdownAfterJobFinishes": True, "clusterSelector": {"a": "b"}}},
    ])  # fmt: skip
    objects = OwnerReader(FakeApi(docs)).read().objects
    why = {name: o.cannot_suspend for (_, _, name), o in objects.items()}
    assert why["ok"] == ""
    assert "shutdownAfterJobFinishes" in why["keeps-cluster"]
    assert "clusterSelector" in why["borrowed"]


def test_kueue_workloads_are_read_with_the_job_they_control_and_their_active_switch() -> None:
    docs = builtin(
        jobs=[
            {
                "metadata": meta("train", labels={"kueue.x-k8s.io/queue-name": "team-q"}),
                "spec": {"suspend": False},
            },
            {
                "metadata": meta("old-style", annotations={"kueue.x-k8s.io/queue-name": "legacy-q"}),
                "spec": {},
            },
        ]
    )
    served(docs, "kueue.x-k8s.io/v1beta2", "workloads", [
        {"metadata": meta("job-train-3f2a1", controller=("batch/v1", "Job", "train")), "spec": {"active": True}},
        {"metadata": meta("off", controller=("batch/v1", "Job", "x")), "spec": {"active": False}},
        {"metadata": meta("defaulted", controller=("batch/v1", "Job", "y")), "spec": {}},
    ])  # fmt: skip
    served(docs, "kueue.x-k8s.io/v1beta1", "workloads", [])
    fake = FakeApi(docs)
    objects = OwnerReader(fake).read().objects
    wl = objects[("ml", "Workload", "job-train-3f2a1")]
    assert wl.ref.api_version == "kueue.x-k8s.io/v1beta2"
    assert wl.controller == OwnerRef("batch/v1", "Job", "train", "uid-train")
    assert (wl.suspended, objects[("ml", "Workload", "off")].suspended) == (False, True)
    assert objects[("ml", "Workload", "defaulted")].suspended is False  # active defaults to true
    assert objects[("ml", "Job", "train")].kueue_queue == "team-q"
    assert objects[("ml", "Job", "old-style")].kueue_queue == "legacy-q"
    assert "/apis/kueue.x-k8s.io/v1beta1/workloads" not in fake.calls  # read once, at the newer version


def test_workloads_of_an_older_kueue_are_read_as_v1beta1(caplog: pytest.LogCaptureFixture) -> None:
    docs = builtin()
    served(docs, "kueue.x-k8s.io/v1beta1", "workloads", [
        {"metadata": meta("wl", controller=("batch/v1", "Job", "j")), "spec": {"active": False}},
    ])  # fmt: skip
    with caplog.at_level(logging.INFO, logger="gpu_efficiency.sources.kube.owners"):
        objects = OwnerReader(FakeApi(docs)).read().objects
    assert objects[("ml", "Workload", "wl")].ref.api_version == "kueue.x-k8s.io/v1beta1"
    assert not any("Workload integration skipped" in r.getMessage() for r in caplog.records)
