"""``gpu-efficiency cleanup``: the uninstall path, so ``helm uninstall`` leaves no trace behind.

The chart's objects go with the release; what the operator wrote on other people's objects does not.
This removes exactly that, and nothing of anyone else's: our fault taint (key
``gpuefficiency.io/gpu-fault``), our node conditions (GPUHealthy, GPUDegraded), our DeviceTaintRules
(named ``gpuefficiency-*`` *and* labelled as ours), and every ``gpuefficiency.io/`` annotation on nodes,
GPU pods and workload owners. An owner still scaled to zero, suspended or stopped keeps its record
(restore needs it) and is listed with its ``gpu-efficiency restore`` command: giving GPUs back is the
owner's decision, not an uninstall's. ``--dry-run`` shows all of it and changes nothing.

It refuses while an operator still holds its Lease (it would write everything again at its next
cycle), unless ``--force``; ``--dry-run`` runs beside it, so the owners to restore (while the policies'
records that restore checks still exist) can be listed before uninstalling. Every write is a patch of only our keys (taints: the whole list with the
read's resourceVersion, so a concurrent change is a conflict, retried on a fresh read).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.actuators.owners import MERGE, PLURALS
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import PREFIX, ReclaimAction
from gpu_efficiency.objects.dra import GROUP as DRA_GROUP
from gpu_efficiency.objects.dra import OURS as OUR_RULES
from gpu_efficiency.objects.dra import RULE_VERSION

STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RULE_PLURAL = "devicetaintrules"
RULE_PREFIX = "gpuefficiency-"
NODE_CONDITIONS = (names.GPU_HEALTHY, names.GPU_DEGRADED)
#: Owner kinds the operator reclaims: kind -> apiVersion (restore's KIND/NAME names them).
OWNER_KINDS: Mapping[str, str] = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "Notebook": "kubeflow.org/v1",
}
LEASE_NAME = "gpu-efficiency-operator"
MAX_ATTEMPTS = 5


@dataclass
class Change:
    """One object and what cleanup removes from it."""

    object: str  # node/gpu-1, pod/team-a/nb-0, devicetaintrule/gpuefficiency-..., deployment/team-a/web
    change: str
    result: str = "pending"  # done | would (dry run) | unchanged | failed: why


@dataclass
class ReclaimedOwner:
    """An owner still reclaimed: left as it is, with the command that gives its GPUs back."""

    owner: str  # NAMESPACE/KIND/NAME
    action: str
    reclaimed_at: str
    reclaimed_by: str
    restore: str


@dataclass
class Cleanup:
    dry_run: bool
    changes: list[Change] = field(default_factory=list)
    reclaimed_owners: list[ReclaimedOwner] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.result.startswith("failed") for c in self.changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "changes": [asdict(c) for c in self.changes],
            "reclaimedOwners": [
                {
                    "owner": o.owner,
                    "action": o.action,
                    "reclaimedAt": o.reclaimed_at,
                    "reclaimedBy": o.reclaimed_by,
                    "restore": o.restore,
                }
                for o in self.reclaimed_owners
            ],
            "notes": list(self.notes),
        }


def ours(annotations: Mapping[str, str] | None) -> list[str]:
    """Our annotation keys (``gpuefficiency.io/...``), never anyone else's."""
    return sorted(k for k in (annotations or {}) if k.startswith(PREFIX))


def _remove_annotations(keys: list[str]) -> dict[str, Any]:
    return {"metadata": {"annotations": dict.fromkeys(keys)}}


def _describe(keys: list[str]) -> str:
    return "remove annotations " + ", ".join(keys)


def _failed(exc: ApiException) -> str:
    return f"failed: HTTP {exc.status} {exc.reason}"


def _taint_dict(taint: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
    if taint.value is not None:
        out["value"] = taint.value
    if taint.time_added is not None:
        added = taint.time_added
        out["timeAdded"] = added if isinstance(added, str) else added.strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def _our_taint(taint: Any) -> bool:
    return bool(taint.key) and (taint.key == names.FAULT_TAINT_KEY or taint.key.startswith(PREFIX))


# --- nodes ------------------------------------------------------------------------------------------


def _node_metadata_patch(node: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The patch removing our taints and annotations from a node as read, and what it says."""
    taints = list(node.spec.taints or []) if node.spec else []
    mine = [t for t in taints if _our_taint(t)]
    keys = ours(node.metadata.annotations)
    if not mine and not keys:
        return None, []
    patch: dict[str, Any] = {"metadata": {"resourceVersion": node.metadata.resource_version}}
    said: list[str] = []
    if mine:
        patch["spec"] = {"taints": [_taint_dict(t) for t in taints if not _our_taint(t)]}
        said.append("remove taints " + ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in mine))
    if keys:
        patch["metadata"]["annotations"] = dict.fromkeys(keys)
        said.append(_describe(keys))
    return patch, said


def _condition_patch(node: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """A JSON patch removing our conditions by index, each guarded by a test of its type (a list
    that moved meanwhile fails the test instead of removing someone else's condition)."""
    conditions = list((node.status.conditions if node.status else None) or [])
    found = [(i, c.type) for i, c in enumerate(conditions) if c.type in NODE_CONDITIONS]
    ops: list[dict[str, Any]] = []
    for index, type_ in reversed(found):  # from the end, so earlier indices stay valid
        path = f"/status/conditions/{index}"
        ops += [{"op": "test", "path": f"{path}/type", "value": type_}, {"op": "remove", "path": path}]
    return ops, [t for _, t in found]


def _retrying(read: Callable[[], Any], write: Callable[[Any], None]) -> str:
    """Read, write what the read asks for, retry on a conflict (409, or a failed JSON-patch test: 422)."""
    for _ in range(MAX_ATTEMPTS):
        try:
            patch = read()
            if patch is None:
                return "unchanged"
            write(patch)
            return "done"
        except ApiException as exc:
            if exc.status == 404:
                return "unchanged"  # gone meanwhile: nothing of ours is left on it
            if exc.status in (409, 422):
                continue
            return _failed(exc)
    return f"failed: conflict after {MAX_ATTEMPTS} attempts"


def _clean_node_metadata(core: Any, listed: Any, out: Cleanup) -> None:
    name = listed.metadata.name
    _, said = _node_metadata_patch(listed)
    if not said:
        return

    def read() -> Any:
        return _node_metadata_patch(core.read_node(name))[0]

    def write(patch: Any) -> None:
        core.patch_node(name, patch, _content_type=STRATEGIC)

    result = "would" if out.dry_run else _retrying(read, write)
    out.changes.append(Change(f"node/{name}", "; ".join(said), result))


def _clean_node_conditions(core: Any, listed: Any, out: Cleanup) -> None:
    name = listed.metadata.name
    _, types = _condition_patch(listed)
    if not types:
        return

    def read() -> Any:
        return _condition_patch(core.read_node_status(name))[0] or None

    def write(ops: Any) -> None:
        core.patch_node_status(name, ops, _content_type=JSON_PATCH)

    result = "would" if out.dry_run else _retrying(read, write)
    out.changes.append(Change(f"node/{name}", "remove conditions " + ", ".join(types), result))


def clean_nodes(core: Any, out: Cleanup) -> None:
    for listed in core.list_node().items:
        _clean_node_metadata(core, listed, out)
        _clean_node_conditions(core, listed, out)


# --- pods, device taint rules, owners ----------------------------------------------------------------


def clean_pods(core: Any, out: Cleanup) -> None:
    for pod in core.list_pod_for_all_namespaces().items:
        keys = ours(pod.metadata.annotations)
        if not keys:
            continue
        ns, name = pod.metadata.namespace, pod.metadata.name
        change = Change(f"pod/{ns}/{name}", _describe(keys))
        if out.dry_run:
            change.result = "would"
        else:
            try:
                core.patch_namespaced_pod(name, ns, _remove_annotations(keys), _content_type=MERGE)
                change.result = "done"
            except ApiException as exc:
                change.result = "unchanged" if exc.status == 404 else _failed(exc)
        out.changes.append(change)


def clean_device_rules(custom: Any, out: Cleanup) -> None:
    try:
        rules = custom.list_cluster_custom_object(
            DRA_GROUP, RULE_VERSION, RULE_PLURAL, label_selector=OUR_RULES
        )
    except ApiException as exc:
        if exc.status == 404:
            out.notes.append(f"DeviceTaintRules ({DRA_GROUP}/{RULE_VERSION}) not served: none to remove")
            return
        out.changes.append(Change("devicetaintrules", "list ours", _failed(exc)))
        return
    for rule in rules.get("items") or []:
        name = (rule.get("metadata") or {}).get("name", "")
        if not name.startswith(RULE_PREFIX):
            continue  # labelled as ours but not named so: not provably ours, left alone
        change = Change(f"devicetaintrule/{name}", "delete")
        if out.dry_run:
            change.result = "would"
        else:
            try:
                custom.delete_cluster_custom_object(DRA_GROUP, RULE_VERSION, RULE_PLURAL, name)
                change.result = "done"
            except ApiException as exc:
                change.result = "unchanged" if exc.status == 404 else _failed(exc)
        out.changes.append(change)


def still_reclaimed(kind: str, obj: Mapping[str, Any]) -> bool:
    """Whether the owner is still as its reclaimed record left it (0 replicas, suspended, stopped)."""
    meta = obj.get("metadata") or {}
    done = (meta.get("annotations") or {}).get(names.RECLAIMED)
    spec = obj.get("spec") or {}
    if done == ReclaimAction.SCALE_TO_ZERO and kind in ("Deployment", "StatefulSet", "LeaderWorkerSet"):
        return int(spec.get("replicas", 1) or 0) == 0
    if done == ReclaimAction.SUSPEND:
        return bool(spec.get("suspend"))
    if done == ReclaimAction.STOP:
        return names.KUBEFLOW_STOPPED in (meta.get("annotations") or {})
    return bool(done)  # an action this version does not know: keep its record, list it


def clean_owners(custom: Any, out: Cleanup) -> None:
    for kind, api_version in OWNER_KINDS.items():
        group, _, version = api_version.rpartition("/")
        plural = PLURALS[kind]
        try:
            listed = custom.list_cluster_custom_object(group, version, plural)
        except ApiException as exc:
            if exc.status != 404:
                out.changes.append(Change(f"{plural}", "list", _failed(exc)))
            continue  # a kind not installed in this cluster
        for obj in listed.get("items") or []:
            meta = obj.get("metadata") or {}
            ns, name = meta.get("namespace", ""), meta.get("name", "")
            ann = meta.get("annotations") or {}
            keys = ours(ann)
            if not keys:
                continue
            label = f"{kind.lower()}/{name}"
            if still_reclaimed(kind, obj):
                out.reclaimed_owners.append(
                    ReclaimedOwner(
                        owner=f"{ns}/{label}",
                        action=ann.get(names.RECLAIMED, ""),
                        reclaimed_at=ann.get(names.RECLAIMED_AT, ""),
                        reclaimed_by=ann.get(names.RECLAIMED_BY, ""),
                        restore=f"gpu-efficiency restore {label} -n {ns}",
                    )
                )
                continue
            change = Change(f"{kind.lower()}/{ns}/{name}", _describe(keys))
            if out.dry_run:
                change.result = "would"
            else:
                try:
                    custom.patch_namespaced_custom_object(
                        group, version, ns, plural, name, _remove_annotations(keys), _content_type=MERGE
                    )
                    change.result = "done"
                except ApiException as exc:
                    change.result = "unchanged" if exc.status == 404 else _failed(exc)
            out.changes.append(change)


def operator_running(coordination: Any, now: datetime) -> str:
    """'' when no operator holds its Lease, else which Lease and how recently it was renewed."""
    leases = coordination.list_lease_for_all_namespaces(field_selector=f"metadata.name={LEASE_NAME}")
    for lease in leases.items:
        spec = lease.spec
        if spec is None or not spec.holder_identity or spec.renew_time is None:
            continue
        renewed = spec.renew_time if spec.renew_time.tzinfo else spec.renew_time.replace(tzinfo=UTC)
        age = (now - renewed).total_seconds()
        if age <= (spec.lease_duration_seconds or 15) + 5:
            return (
                f"Lease {lease.metadata.namespace}/{LEASE_NAME} is held by {spec.holder_identity}, "
                f"renewed {age:.0f}s ago"
            )
    return ""


def cleanup(core: Any, custom: Any, *, dry_run: bool) -> Cleanup:
    """Remove what the operator wrote on other objects (or, dry run, say what would be removed)."""
    out = Cleanup(dry_run=dry_run)
    clean_nodes(core, out)
    clean_device_rules(custom, out)
    clean_pods(core, out)
    clean_owners(custom, out)
    out.notes.append(
        "left alone: GPUEfficiencyPolicies and their CRD (kubectl delete gep --all; kubectl delete crd "
        "gpuefficiencypolicies.gpuefficiency.io), namespace annotations you set "
        f"({names.NOTIFY_CHANNEL}, {names.SLACK_URL_SECRET_KEY}), events"
    )
    return out


def render_table(doc: Mapping[str, Any]) -> str:
    verb = "Would change" if doc["dryRun"] else "Changed"
    lines = [f"{verb} ({len(doc['changes'])}):" if doc["changes"] else "Nothing of ours is left to remove."]
    lines += [f"  {c['result']:9}  {c['object']}: {c['change']}" for c in doc["changes"]]
    owners = doc["reclaimedOwners"]
    if owners:
        lines.append(
            f"\nStill reclaimed ({len(owners)}), left as they are with their record; give the GPUs back with:"
        )
        lines += [
            f"  {o['restore']}    # {o['action']} at {o['reclaimedAt']} by {o['reclaimedBy']}" for o in owners
        ]
    lines += [f"\nnote: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def cleanup_main(args: argparse.Namespace) -> int:
    from gpu_efficiency.cli_common import EXIT_FAILED, EXIT_OK, CliError, load_client, render

    api_client = load_client(args)
    if not args.force and not args.dry_run:  # a dry run writes nothing: safe beside a running operator
        running = operator_running(client.CoordinationV1Api(api_client), datetime.now(UTC))
        if running:
            raise CliError(
                f"the operator is still running ({running}): it would write everything again; "
                "uninstall it first (helm uninstall), or pass --force",
                EXIT_FAILED,
            )
    result = cleanup(client.CoreV1Api(api_client), client.CustomObjectsApi(api_client), dry_run=args.dry_run)
    sys.stdout.write(render(result.as_dict(), args.output, render_table) + "\n")
    return EXIT_FAILED if result.failed else EXIT_OK
