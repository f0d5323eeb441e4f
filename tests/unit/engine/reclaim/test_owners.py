"""Owner resolution and the action per owner kind, on plain data (engine/reclaim/owners.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.engine.owner_builders import chain, obj, our_record, owned, ref

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import OwnerActions, ReclaimAction
from gpu_efficiency.engine.reclaim.owners import (
    already_reclaimed,
    choose_action,
    kubectl_restore,
    recommendation,
    resolve_owner,
    restore_commands,
)
from gpu_efficiency.engine.reclaim.reclaimedbyus import reclaimed_by_us


def index(*objects):  # type: ignore[no-untyped-def]
    return {(o.namespace, o.ref.kind, o.ref.name): o for o in objects}


@pytest.mark.parametrize(
    ("links", "top"),
    [
        ([("ReplicaSet", "nb-5d9"), ("Deployment", "nb")], ("Deployment", "nb")),
        ([("StatefulSet", "db")], ("StatefulSet", "db")),
        ([("StatefulSet", "lab"), ("Notebook", "lab")], ("Notebook", "lab")),
        ([("Job", "train-w-0"), ("JobSet", "train")], ("JobSet", "train")),
        ([("Job", "once")], ("Job", "once")),
        ([("StatefulSet", "llm"), ("LeaderWorkerSet", "llm")], ("LeaderWorkerSet", "llm")),
        (
            [("ReplicaSet", "pred-1"), ("Deployment", "pred"), ("InferenceService", "pred")],
            ("InferenceService", "pred"),
        ),
    ],
)
def test_the_chain_is_followed_to_the_top_owner(links: list[tuple[str, str]], top: tuple[str, str]) -> None:
    pod = owned("p", links[0])
    owner = resolve_owner(pod, index(*chain(*links)))
    assert (owner.ref.kind, owner.ref.name, owner.known) == (*top, True)
    assert owner.label == f"{top[0].lower()}/{top[1]}"


def test_a_bare_pod_is_its_own_owner() -> None:
    owner = resolve_owner(owned("solo", None), {})
    assert (owner.ref.kind, owner.ref.name, owner.known) == ("Pod", "solo", True)


@pytest.mark.parametrize(
    ("links", "read", "why"),
    [
        # the ReplicaSet's Deployment was not read: scaling the ReplicaSet would fight it
        ([("ReplicaSet", "nb-1"), ("Deployment", "nb")], 1, "not found"),
        ([("Thing", "x")], 0, "without an integration"),  # a controller CRD of some other operator
        ([("DaemonSet", "agent")], 0, "without an integration"),
    ],
)
def test_an_owner_not_read_or_without_integration_is_unknown(
    links: list[tuple[str, str]], read: int, why: str
) -> None:
    owner = resolve_owner(owned("p", links[0]), index(*chain(*links)[:read]))
    assert not owner.known
    assert why in owner.why


def test_an_owner_of_another_group_or_uid_is_not_taken_for_ours() -> None:
    pod = owned("p", ("StatefulSet", "lab"))
    sts = obj("StatefulSet", "lab", controller=replace(ref("Notebook", "lab"), api_version="other.io/v1"))
    foreign = replace(obj("Notebook", "lab"), ref=replace(ref("Notebook", "lab"), api_version="other.io/v1"))
    assert not resolve_owner(pod, index(sts, foreign)).known
    successor = replace(obj("StatefulSet", "lab"), ref=replace(ref("StatefulSet", "lab"), uid="new-uid"))
    assert "not found" in resolve_owner(pod, index(successor)).why


def test_a_controller_loop_in_bad_data_ends_unknown() -> None:
    a = obj("ReplicaSet", "a", controller=ref("ReplicaSet", "b"))
    b = obj("ReplicaSet", "b", controller=ref("ReplicaSet", "a"))
    assert not resolve_owner(owned("p", ("ReplicaSet", "a")), index(a, b)).known


DEFAULTS = {
    "Deployment": ReclaimAction.SCALE_TO_ZERO,
    "StatefulSet": ReclaimAction.SCALE_TO_ZERO,
    "Job": ReclaimAction.SUSPEND,
    "JobSet": ReclaimAction.SUSPEND,
    "Notebook": ReclaimAction.STOP,
    "LeaderWorkerSet": ReclaimAction.RECOMMEND,
    "InferenceService": ReclaimAction.RECOMMEND,
}


@pytest.mark.parametrize(("kind", "action"), DEFAULTS.items())
def test_default_action_per_kind(kind: str, action: ReclaimAction) -> None:
    owner = resolve_owner(owned("p", (kind, "w")), index(obj(kind, "w")))
    assert choose_action(owner, OwnerActions())[0] is action


def test_bare_pods_and_pods_of_unknown_owners_are_evicted() -> None:
    """Nothing we know recreates the pod of a controller we cannot act on: it gets the bare pods'
    action (it used to be Recommend only: a way to keep an idle GPU for ever)."""
    assert choose_action(resolve_owner(owned("p", None), {}), OwnerActions())[0] is ReclaimAction.EVICT
    unknown = resolve_owner(owned("p", ("ConfigMap", "x")), {})
    action, why = choose_action(unknown, OwnerActions())
    assert action is ReclaimAction.EVICT
    assert "configmap/x cannot be acted on" in why
    assert choose_action(unknown, OwnerActions(pod=ReclaimAction.RECOMMEND))[0] is ReclaimAction.RECOMMEND


def test_a_standalone_replicaset_is_its_own_owner() -> None:
    owner = resolve_owner(owned("p", ("ReplicaSet", "rs")), index(obj("ReplicaSet", "rs")))
    assert (owner.known, owner.label) == (True, "replicaset/rs")
    assert choose_action(owner, OwnerActions()) == (ReclaimAction.SCALE_TO_ZERO, "")


def test_a_cronjobs_job_is_the_owner_and_names_its_cronjob() -> None:
    objects = index(*chain(("Job", "nightly-1"), ("CronJob", "nightly")))
    owner = resolve_owner(owned("p", ("Job", "nightly-1")), objects)
    assert (owner.known, owner.label) == (True, "job/nightly-1")
    assert owner.scheduler is not None
    assert owner.scheduler.name == "nightly"
    assert choose_action(owner, OwnerActions()) == (ReclaimAction.SUSPEND, "")


def test_the_admin_may_choose_evict_or_recommend() -> None:
    owner = resolve_owner(owned("p", ("StatefulSet", "db")), index(obj("StatefulSet", "db")))
    assert choose_action(owner, OwnerActions(stateful_set=ReclaimAction.EVICT))[0] is ReclaimAction.EVICT
    chosen = choose_action(owner, OwnerActions(stateful_set=ReclaimAction.RECOMMEND))
    assert chosen == (ReclaimAction.RECOMMEND, "reclaim.actions.StatefulSet is Recommend")


def test_recommendation_texts() -> None:
    owner = resolve_owner(owned("p", ("StatefulSet", "db")), index(obj("StatefulSet", "db")))
    assert recommendation(owner, 3, 4) == "3 of 4 replicas idle: reduce replicas of statefulset/db"
    assert recommendation(owner, 2, 2) == "all 2 GPU pod(s) of statefulset/db idle: scale it to zero"


def test_already_reclaimed_only_while_the_owner_is_still_in_that_state() -> None:
    done = {names.RECLAIMED: "ScaleToZero"}
    at_zero = resolve_owner(
        owned("p", ("StatefulSet", "db")), index(obj("StatefulSet", "db", replicas=0, annotations=done))
    )
    scaled_back = resolve_owner(
        owned("p", ("StatefulSet", "db")), index(obj("StatefulSet", "db", replicas=2, annotations=done))
    )
    ours = [our_record("StatefulSet", "db")]
    assert already_reclaimed(at_zero, ours) == "ScaleToZero"
    assert already_reclaimed(scaled_back, ours) == ""


def test_a_reclaimed_annotation_without_our_status_record_proves_nothing() -> None:
    """Issue 32's escape: a decoy Deployment at 0 replicas carrying our annotation is not taken as
    reclaimed by us unless our own status holds a record in force for its uid."""
    done = {names.RECLAIMED: "ScaleToZero"}
    decoy = resolve_owner(
        owned("p", ("Deployment", "decoy")), index(obj("Deployment", "decoy", replicas=0, annotations=done))
    )
    assert already_reclaimed(decoy, []) == ""
    other_uid = our_record("Deployment", "decoy", uid="uid-of-a-deleted-namesake")
    assert already_reclaimed(decoy, [other_uid]) == ""
    assert already_reclaimed(decoy, [our_record("Deployment", "decoy", returned=False)]) == ""
    assert reclaimed_by_us("", [our_record("Deployment", "decoy", uid="")]) is None
    assert already_reclaimed(decoy, [our_record("Deployment", "decoy")]) == "ScaleToZero"


def test_restore_commands_name_the_cli_and_kubectl() -> None:
    text = restore_commands("ml", "Deployment", "nb")
    assert "gpu-efficiency restore deployment/nb -n ml" in text
    assert "kubectl scale deployment/nb -n ml --replicas=" in text
    assert 'suspend":false' in kubectl_restore("ml", "Job", "train")
    assert "kubectl annotate notebook/lab -n ml kubeflow-resource-stopped-" in kubectl_restore(
        "ml", "Notebook", "lab"
    )
