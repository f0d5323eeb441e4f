"""``gpu-efficiency restore KIND/NAME -n NS`` (default: the context's namespace): undo a reclaim from the record written on the owner.

Scaled to zero -> the previous replicas (unless someone scaled it up meanwhile: then their choice
stands and only the record is cleared); suspended -> resumed (at the kind's own switch:
api/suspend_fields.py); a Kueue Workload deactivated -> reactivated (spec.active=true: Kueue requeues
it, and admits and unsuspends its job when quota allows); stopped -> the kubeflow-resource-stopped
annotation removed. Our owner annotations are removed in every case. An owner without our record
is left untouched with a clear error, and so is one whose annotations no policy's
``status.reclamations`` backs for its uid (a tenant can write ``previous-replicas: 1000``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpu_efficiency.actuators.events import ObjectRef
from gpu_efficiency.actuators.owners import MERGE, Target
from gpu_efficiency.actuators.status import read_status
from gpu_efficiency.actuators.uncertain import describe, outcome_unknown
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION, ReclaimAction
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.api.suspend_fields import INVERTED, SUSPEND_PATHS, spec_field, suspend_patch
from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine import reclaimed_by_us
from gpu_efficiency.engine.model import OwnerRef

#: KIND spellings accepted (kubectl's names and short names) -> (kind, apiVersion).
KINDS: Mapping[str, tuple[str, str]] = {
    **dict.fromkeys(("deployment", "deployments", "deploy"), ("Deployment", "apps/v1")),
    **dict.fromkeys(("replicaset", "replicasets", "rs"), ("ReplicaSet", "apps/v1")),
    **dict.fromkeys(("statefulset", "statefulsets", "sts"), ("StatefulSet", "apps/v1")),
    **dict.fromkeys(("job", "jobs"), ("Job", "batch/v1")),
    **dict.fromkeys(("jobset", "jobsets"), ("JobSet", "jobset.x-k8s.io/v1alpha2")),
    **dict.fromkeys(
        ("leaderworkerset", "leaderworkersets", "lws"), ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1")
    ),
    **dict.fromkeys(("notebook", "notebooks"), ("Notebook", "kubeflow.org/v1")),
    **dict.fromkeys(("raycluster", "rayclusters"), ("RayCluster", "ray.io/v1")),
    **dict.fromkeys(("rayjob", "rayjobs"), ("RayJob", "ray.io/v1")),
    **dict.fromkeys(("pytorchjob", "pytorchjobs"), ("PyTorchJob", "kubeflow.org/v1")),
    **dict.fromkeys(("mpijob", "mpijobs"), ("MPIJob", "kubeflow.org/v1")),
    **dict.fromkeys(("tfjob", "tfjobs"), ("TFJob", "kubeflow.org/v1")),
    **dict.fromkeys(("trainjob", "trainjobs"), ("TrainJob", "trainer.kubeflow.org/v1alpha1")),
    **dict.fromkeys(("workload", "workloads"), ("Workload", "kueue.x-k8s.io/v1beta2")),
}
#: Older API versions tried when the first is not served (Kueue before v0.15 serves only v1beta1).
OLDER_VERSIONS: Mapping[str, tuple[str, ...]] = {"Workload": ("kueue.x-k8s.io/v1beta1",)}
EXIT_NOTHING = 1
EXIT_USAGE = 2


class RestoreError(Exception):
    def __init__(self, message: str, code: int = EXIT_NOTHING) -> None:
        super().__init__(message)
        self.code = code


def parse_target(text: str) -> tuple[str, str, str]:
    """``deployment/nb`` -> (kind, apiVersion, name)."""
    kind_text, _, name = text.partition("/")
    found = KINDS.get(kind_text.lower())
    if found is None or not name:
        known = ", ".join(sorted({k for k, _ in KINDS.values()}))
        raise RestoreError(f"expected KIND/NAME with KIND one of {known} (got {text!r})", EXIT_USAGE)
    return found[0], found[1], name


def restore(
    api: client.CustomObjectsApi,
    target: str,
    namespace: str,
    record_event: Callable[[ObjectRef, str], None] | None = None,
) -> str:
    """Undo the reclaim recorded on the owner; returns what was done (raises RestoreError).

    The owner's annotations are its user's to edit, so they are believed only as far as a policy's
    ``status.reclamations`` (written by the operator alone) recorded this object's uid: the action
    must match, and the replicas brought back are capped at the count recorded there."""
    kind, api_version, name = parse_target(target)
    label = f"{kind.lower()}/{name}"
    t, obj = _read(api, kind, api_version, name, namespace)
    api_version = f"{t.group}/{t.version}"
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    done = ann.get(names.RECLAIMED)
    if not done:
        raise RestoreError(
            f"nothing to restore: {label} in {namespace} carries no {names.RECLAIMED} annotation "
            "(it was not reclaimed by gpu-efficiency, or was restored already)"
        )
    record = reclaimed_by_us(str(meta.get("uid") or ""), our_records(api))
    if record is None:
        raise RestoreError(
            f"{label} in {namespace} carries {names.RECLAIMED}={done!r}, but no policy's status.reclamations "
            f"records reclaiming this object (uid {meta.get('uid') or '?'}): it was not reclaimed by "
            "gpu-efficiency (or was restored already, or before records kept uids); nothing changed"
        )
    if record.action != done:
        raise RestoreError(
            f"{label}: {names.RECLAIMED}={done!r} on the owner, but policy records {record.action!r}; "
            "nothing changed"
        )
    clear: dict[str, Any] = dict.fromkeys(names.OWNER_ANNOTATIONS)
    body: dict[str, Any] = {"metadata": {"uid": meta.get("uid"), "annotations": clear}}
    try:
        if done == ReclaimAction.SCALE_TO_ZERO:
            what = _scale_back(api, t, label, ann, record)
        elif done in (ReclaimAction.SUSPEND, ReclaimAction.DEACTIVATE) and kind in SUSPEND_PATHS:
            body["spec"] = suspend_patch(kind, False)
            verb = "reactivated" if kind in INVERTED else "resumed"
            what = f"{verb} ({spec_field(kind)}={str(kind in INVERTED).lower()})"
        elif done == ReclaimAction.STOP:
            clear[names.KUBEFLOW_STOPPED] = None
            what = f"started ({names.KUBEFLOW_STOPPED} removed)"
        else:
            raise RestoreError(f"{label}: unknown {names.RECLAIMED} value {done!r}; nothing changed")
        _write(api, t, body)
    except (ApiException, HTTPError, OSError) as exc:
        raise RestoreError(f"restoring {label} in {namespace} failed: {describe(exc)}") from exc
    message = f"restored {label} in {namespace}: {what}"
    if record_event is not None:
        ref = ObjectRef(
            kind=kind, name=name, uid=meta.get("uid", ""), namespace=namespace, api_version=api_version
        )
        record_event(ref, message)
    return message


def _read(
    api: client.CustomObjectsApi, kind: str, api_version: str, name: str, namespace: str
) -> tuple[Target, Any]:
    """The owner and where it was found (the first of its API versions that has it)."""
    label = f"{kind.lower()}/{name}"
    versions = (api_version, *OLDER_VERSIONS.get(kind, ()))
    for i, version in enumerate(versions):
        t = Target.of(namespace, OwnerRef(version, kind, name))
        try:
            return t, api.get_namespaced_custom_object(t.group, t.version, t.namespace, t.plural, t.name)
        except ApiException as exc:
            if exc.status == 404 and i + 1 < len(versions):
                continue
            if exc.status == 404:
                raise RestoreError(f"{label} not found in namespace {namespace}") from exc
            raise RestoreError(f"cannot read {label} in {namespace}: HTTP {exc.status} {exc.reason}") from exc
    raise AssertionError("unreachable: versions is never empty")


def our_records(api: client.CustomObjectsApi) -> list[Reclamation]:
    """Every policy's reclamation records, oldest first: the only proof of what we reclaimed."""
    try:
        found: Any = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    except ApiException as exc:
        raise RestoreError(
            f"cannot read the policies' status.reclamations, the record of what gpu-efficiency "
            f"reclaimed: HTTP {exc.status} {exc.reason}; nothing changed"
        ) from exc
    records = [
        record
        for item in (found.get("items") or [] if isinstance(found, Mapping) else [])
        if isinstance(item, Mapping)
        for record in read_status(item.get("status") or {})[0].reclamations
    ]
    return sorted(records, key=lambda r: parse_rfc3339(r.time) or 0.0)


def _write(api: client.CustomObjectsApi, t: Target, body: Mapping[str, Any]) -> None:
    """The final patch (state and record together, or the record alone). Answered with a 5xx or a
    timeout, it may have been applied: a re-read says whether our annotations are gone."""
    try:
        api.patch_namespaced_custom_object(
            t.group, t.version, t.namespace, t.plural, t.name, dict(body), _content_type=MERGE
        )
    except (ApiException, HTTPError, OSError) as exc:
        why = outcome_unknown(exc)
        if not why:
            raise
        try:
            obj: Any = api.get_namespaced_custom_object(t.group, t.version, t.namespace, t.plural, t.name)
        except (ApiException, HTTPError, OSError) as again:
            raise RestoreError(
                f"the API answered {why} and the re-read failed ({describe(again)}): the restore may "
                "or may not have been applied; run it again"
            ) from exc
        if names.RECLAIMED in ((obj.get("metadata") or {}).get("annotations") or {}):
            raise RestoreError(f"the API answered {why} and the owner is unchanged; run it again") from exc


def _scale_back(
    api: client.CustomObjectsApi, t: Target, label: str, ann: Mapping[str, str], record: Reclamation
) -> str:
    text = ann.get(names.PREVIOUS_REPLICAS, "")
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise RestoreError(
            f"{label}: {names.PREVIOUS_REPLICAS}={text!r} is not a replica count (ASCII digits, at least 1); "
            "nothing changed"
        )
    if record.replicas is None or record.replicas < 1:
        raise RestoreError(
            f"{label}: the policy's record of this reclamation holds no replica count; nothing changed"
        )
    wanted = min(int(text), record.replicas)
    capped = (
        f" ({names.PREVIOUS_REPLICAS}={text} capped at the {record.replicas} the policy recorded)"
        if int(text) > record.replicas
        else ""
    )
    scale: Any = api.get_namespaced_custom_object_scale(t.group, t.version, t.namespace, t.plural, t.name)
    current = int((scale.get("spec") or {}).get("replicas") or 0)
    if current > 0:
        return f"already at {current} replicas (scaled meanwhile): only the record is cleared"
    version = (scale.get("metadata") or {}).get("resourceVersion")
    body = {"metadata": {"resourceVersion": version} if version else {}, "spec": {"replicas": wanted}}
    try:
        api.patch_namespaced_custom_object_scale(
            t.group, t.version, t.namespace, t.plural, t.name, body, _content_type=MERGE
        )
    except (ApiException, HTTPError, OSError) as exc:
        why = outcome_unknown(exc)
        if not why:
            raise
        try:
            again: Any = api.get_namespaced_custom_object_scale(
                t.group, t.version, t.namespace, t.plural, t.name
            )
        except (ApiException, HTTPError, OSError) as failed:
            raise RestoreError(
                f"scaling {label} answered {why} and the re-read failed ({describe(failed)}): it may or "
                "may not be scaled; run restore again (nothing else changed)"
            ) from exc
        if int((again.get("spec") or {}).get("replicas") or 0) != wanted:
            raise RestoreError(
                f"scaling {label} answered {why} and it is not scaled; nothing changed"
            ) from exc
    hpa = ann.get(names.RECLAIMED_AUTOSCALER)
    # The HPA controller resumes scaling a target once its replicas are above 0 (ScalingActive again).
    return f"replicas 0 -> {wanted}{capped}" + (f"; {hpa} takes over scaling again" if hpa else "")


def restore_main(args: argparse.Namespace) -> int:
    from gpu_efficiency.actuators.events import EventRecorder
    from gpu_efficiency.cli_common import CliError, current_namespace, load_client

    try:
        parse_target(args.target)
        namespace = current_namespace(args)
        api_client = load_client(args)
        recorder = EventRecorder(api_client)

        def record_event(ref: ObjectRef, message: str) -> None:
            try:
                recorder.record(ref, names.EV_RESTORED, message)
            except ApiException as exc:  # the restore happened; the event is a courtesy
                sys.stderr.write(f"note: event not recorded (HTTP {exc.status})\n")

        message = restore(client.CustomObjectsApi(api_client), args.target, namespace, record_event)
    except RestoreError as exc:
        raise CliError(str(exc), exc.code) from None
    sys.stdout.write(message + "\n")
    return 0
