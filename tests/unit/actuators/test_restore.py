"""``gpu-efficiency restore``: each reclaim undone from the owner's record, and clear errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_efficiency import cli
from gpu_efficiency.actuators.owners import reclaim_owner
from gpu_efficiency.api import names
from gpu_efficiency.restore import RestoreError, restore

from .fake_custom import FakeCustom
from .test_owners import DEPLOY, JOB, NOTEBOOK, NOW, action


def test_a_deployment_comes_back_with_its_previous_replicas_and_the_record_cleared() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=2, annotations={"keep": "me"})
    reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    api.record(DEPLOY, "Deployment", replicas=2)
    events: list[str] = []
    message = restore(
        api, "deployment/nb", "ml", lambda ref, text: events.append(f"{ref.kind}/{ref.name}: {text}")
    )  # type: ignore[arg-type]
    assert message == "restored deployment/nb in ml: replicas 0 -> 2"
    assert obj["spec"]["replicas"] == 2
    assert obj["metadata"]["annotations"] == {"keep": "me"}
    assert events == ["Deployment/nb: restored deployment/nb in ml: replicas 0 -> 2"]


def test_an_hpa_target_and_a_standalone_replicaset_go_the_same_way_back() -> None:
    """The HPA is recorded on the owner scaled to zero; restore scales it back and says the HPA
    takes over (its controller resumes once the target's replicas are above 0)."""
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=3)
    hpa = replace(action("Deployment", "nb", "ScaleToZero"), autoscaler="nb-hpa")
    reclaim_owner(api, hpa, NOW)  # type: ignore[arg-type]
    assert obj["metadata"]["annotations"][names.RECLAIMED_AUTOSCALER] == "horizontalpodautoscaler/nb-hpa"
    api.record(DEPLOY, "Deployment", replicas=3)
    message = restore(api, "deployment/nb", "ml")  # type: ignore[arg-type]
    assert (
        message
        == "restored deployment/nb in ml: replicas 0 -> 3; horizontalpodautoscaler/nb-hpa takes over scaling again"
    )
    assert obj["metadata"]["annotations"] == {}
    rs = api.add(("apps", "v1", "ml", "replicasets", "w"), replicas=2)
    reclaim_owner(api, action("ReplicaSet", "w", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    assert rs["spec"]["replicas"] == 0
    api.record(("apps", "v1", "ml", "replicasets", "w"), "ReplicaSet", replicas=2)
    assert restore(api, "rs/w", "ml") == "restored replicaset/w in ml: replicas 0 -> 2"  # type: ignore[arg-type]
    assert rs["spec"]["replicas"] == 2


def test_a_suspended_job_is_resumed() -> None:
    api = FakeCustom()
    obj = api.add(JOB, suspend=False)
    reclaim_owner(api, action("Job", "train", "Suspend", "batch/v1"), NOW)  # type: ignore[arg-type]
    api.record(JOB, "Job", "Suspend")
    assert "resumed" in restore(api, "job/train", "ml")  # type: ignore[arg-type]
    assert obj["spec"]["suspend"] is False
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)


def test_a_stopped_notebook_is_started() -> None:
    api = FakeCustom()
    obj = api.add(NOTEBOOK)
    reclaim_owner(api, action("Notebook", "lab", "Stop", "kubeflow.org/v1"), NOW)  # type: ignore[arg-type]
    api.record(NOTEBOOK, "Notebook", "Stop")
    restore(api, "notebook/lab", "ml")  # type: ignore[arg-type]
    assert obj["metadata"]["annotations"] == {}


def test_an_owner_scaled_up_meanwhile_keeps_its_replicas() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=2)
    reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    api.record(DEPLOY, "Deployment", replicas=2)
    obj["spec"]["replicas"] = 4
    assert "only the record is cleared" in restore(api, "deploy/nb", "ml")  # type: ignore[arg-type]
    assert obj["spec"]["replicas"] == 4
    assert names.RECLAIMED not in obj["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("target", "prepare", "error"),
    [
        ("deployment/nb", lambda api: api.add(DEPLOY, replicas=1), "nothing to restore"),
        ("deployment/other", lambda api: None, "not found in namespace ml"),
        ("daemonset/agent", lambda api: None, "expected KIND/NAME"),
        ("deployment", lambda api: None, "expected KIND/NAME"),
        ("deployment/nb", lambda api: ours(api, "x"), "is not a replica count"),
        ("deployment/nb", lambda api: ours(api, "²"), "is not a replica count"),  # was a ValueError
        ("deployment/nb", lambda api: ours(api, "٣٠٠"), "is not a replica count"),  # was 300
        ("deployment/nb", lambda api: ours(api, "0"), "is not a replica count"),
        # issue 31.4: a record no policy's status backs (reclaimed-by naming no policy) restores nothing
        ("deployment/nb", lambda api: forged(api, "1000"), "no policy's status.reclamations records"),
        ("deployment/nb", lambda api: ours(api, "2", action="Suspend"), "policy records 'Suspend'"),
        ("deployment/nb", lambda api: ours(api, "2", replicas=None), "holds no replica count"),
        ("deployment/nb", lambda api: ours(api, "2", other_uid=True), "no policy's status.reclamations"),
    ],
)
def test_nothing_to_restore_or_bad_input_is_a_clear_error_and_changes_nothing(
    target: str, prepare: Any, error: str
) -> None:
    api = FakeCustom()
    prepare(api)
    before = repr(api.objects)
    with pytest.raises(RestoreError, match=error):
        restore(api, target, "ml")  # type: ignore[arg-type]
    assert repr(api.objects) == before


def forged(api: FakeCustom, previous: str) -> None:
    """What a tenant can write on its own Deployment: our annotations, a policy that never was."""
    annotations = {
        names.RECLAIMED: "ScaleToZero", names.PREVIOUS_REPLICAS: previous, names.RECLAIMED_BY: "no-such-policy",
    }  # fmt: skip
    api.add(DEPLOY, replicas=0, annotations=annotations)


def ours(
    api: FakeCustom,
    previous: str,
    *,
    action: str = "ScaleToZero",
    replicas: int | None = 2,
    other_uid: bool = False,
) -> None:
    """Reclaimed by a policy, whose status recorded it (``other_uid``: a same-named predecessor)."""
    forged(api, previous)
    api.record(DEPLOY, "Deployment", action, replicas)
    if other_uid:
        api.policies[-1]["status"]["reclamations"][0]["uid"] = "uid-of-a-deleted-namesake"


def test_previous_replicas_are_capped_at_the_count_the_policy_recorded() -> None:
    api = FakeCustom()
    ours(api, "1000", replicas=3)
    message = restore(api, "deployment/nb", "ml")  # type: ignore[arg-type]
    assert message.startswith("restored deployment/nb in ml: replicas 0 -> 3 (")
    assert "capped at the 3 the policy recorded" in message
    assert api.objects[DEPLOY]["spec"]["replicas"] == 3


def test_the_policies_unreadable_is_a_clear_error_and_changes_nothing() -> None:
    api = FakeCustom()
    ours(api, "2")
    api.fail["list policies"] = 403
    before = repr(api.objects)
    with pytest.raises(RestoreError, match=r"cannot read the policies' status\.reclamations"):
        restore(api, "deployment/nb", "ml")  # type: ignore[arg-type]
    assert repr(api.objects) == before


def test_a_scale_back_committed_then_answered_504_still_restores() -> None:
    api = FakeCustom()
    obj = api.add(DEPLOY, replicas=2)
    reclaim_owner(api, action("Deployment", "nb", "ScaleToZero"), NOW)  # type: ignore[arg-type]
    api.record(DEPLOY, "Deployment", replicas=2)
    api.after["patch scale"] = ApiException(status=504, reason="Gateway Timeout")
    api.after["patch"] = ApiException(status=504, reason="Gateway Timeout")
    assert restore(api, "deployment/nb", "ml") == "restored deployment/nb in ml: replicas 0 -> 2"  # type: ignore[arg-type]
    assert obj["spec"]["replicas"] == 2
    assert not any(k in obj["metadata"]["annotations"] for k in names.OWNER_ANNOTATIONS)


def test_the_cli_parses_restore(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["restore", "deployment/nb", "-n", "ml"])
    assert (args.target, args.target_namespace) == ("deployment/nb", "ml")
    assert cli.main(["restore", "pod/x", "-n", "ml"]) == 2
    assert "gpu-efficiency restore: error: expected KIND/NAME" in capsys.readouterr().err
