"""Proof that reclaimed GPUs were returned and used: the status record of each reclamation.

A record is drafted with each planned reclamation (what it frees, where, and which GPU pods were
waiting then) and kept only when the API accepts the action. Every later cycle advances it:

* GPU-hours returned: while the reclamation is in force, its GPUs times the time since the previous
  cycle (the same capped interval as idleGpuHours); a GPU that several records in force name
  (time-sliced pods reclaimed apart) counts once. It ends, for good, when a new pod of one of its
  controllers appears (a pod that started after the action, or has not started: the owner was
  restored or recreated its pods) or, when owners were read this cycle, when the owner is no longer
  in its reclaimed state (restored) or is gone. A lower bound: only the last records are kept.
* Reclaim to running: the first waiting pod seen Running on one of the freed nodes gives the time
  from the action to that pod's status.startTime (when its kubelet took it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.api.status import Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import OwnerKey, OwnerObject, PendingPod, PodView
from gpu_efficiency.engine.reclaim.owners import Owner, in_reclaimed_state

MAX_RECORDS = 10  # reclamations that ended, kept for their figures
#: Reclamations in force, kept because they are the proof ``restore`` and the engine rely on
#: (engine/reclaim/reclaimedbyus.py): dropping one would make its owner unrestorable.
MAX_IN_FORCE = 500
MAX_WAITING = 8


def owner_text(key: OwnerKey) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


def freed_gpu_ids(pods: Sequence[PodView], uuids: Mapping[tuple[str, str], Sequence[str]]) -> list[str]:
    """The distinct GPUs ``pods`` hold when every pod's are known, else none."""
    known = [uuids.get((p.namespace, p.name)) for p in pods]
    if known and all(known):
        return sorted({u for found in known if found for u in found})
    return []


def freed_gpus(pods: Sequence[PodView], uuids: Mapping[tuple[str, str], Sequence[str]]) -> int:
    """The GPUs ``pods`` hold: distinct GPUs when every pod's are known (replicas time-sliced on one
    GPU free it once), else their nvidia.com/gpu requests."""
    ids = freed_gpu_ids(pods, uuids)
    return len(ids) if ids else sum(p.gpu_request for p in pods)


def draft(
    owner: Owner,
    action: str,
    *,
    pods: Sequence[PodView],
    waiting: Sequence[str],
    now: float,
    gpus: int | None = None,
    gpu_ids: Sequence[str] = (),
) -> Reclamation:
    """The record of reclaiming ``owner`` (its GPU ``pods``, holding ``gpus`` GPUs: default their
    requests) now, for the ``waiting`` pods."""
    controllers = sorted(
        {f"{p.controller.kind}/{p.controller.name}" if p.controller else f"Pod/{p.name}" for p in pods}
    )
    obj = owner.obj
    return Reclamation(
        owner=owner_text(owner.key),
        uid=obj.ref.uid if obj is not None else owner.ref.uid,
        replicas=obj.replicas if obj is not None and action == ReclaimAction.SCALE_TO_ZERO else None,
        action=action,
        time=format_rfc3339(now),
        nodes=sorted({p.node for p in pods if p.node}),
        gpus=sum(p.gpu_request for p in pods) if gpus is None else gpus,
        gpu_ids=list(gpu_ids),
        controllers=controllers,
        waiting_pods=list(waiting[:MAX_WAITING]),
    )


def waiting_names(pending: Sequence[PendingPod]) -> list[str]:
    return [f"{p.namespace}/{p.name}" for p in pending]


def _back(
    record: Reclamation, pods: Sequence[PodView], owners: Mapping[OwnerKey, OwnerObject] | None
) -> bool:
    """The reclamation is no longer in force: its owner was restored, recreated pods, or is gone."""
    since = parse_rfc3339(record.time) or 0.0
    controllers = set(record.controllers)
    for pod in pods:
        mine = f"{pod.controller.kind}/{pod.controller.name}" if pod.controller else f"Pod/{pod.name}"
        namespace = record.owner.split("/", 1)[0]
        if (
            pod.namespace == namespace
            and mine in controllers
            and not pod.deleting
            and (pod.start_time is None or pod.start_time >= since)
        ):
            return True
    if owners is None:
        return False
    namespace, kind, name = record.owner.split("/", 2)
    if kind == "Pod":
        return False  # an evicted bare pod has no object to read; a new one shows as a pod above
    obj = owners.get((namespace, kind, name))
    if obj is None or (record.uid and obj.ref.uid != record.uid):
        return True  # gone, or a same-named successor: ours is not there any more
    return not in_reclaimed_state(obj, record.action)


def _first_running(record: Reclamation, pods: Sequence[PodView], now: float) -> tuple[str, float] | None:
    waiting, nodes = set(record.waiting_pods), set(record.nodes)
    since = parse_rfc3339(record.time) or now
    running = [
        (p.start_time if p.start_time is not None else now, f"{p.namespace}/{p.name}")
        for p in pods
        if p.phase == "Running" and p.node in nodes and f"{p.namespace}/{p.name}" in waiting
    ]
    if not running:
        return None
    started, who = min(running)
    return who, max(0.0, started - since)


def advance(
    records: Sequence[Reclamation],
    pods: Sequence[PodView],
    owners: Mapping[OwnerKey, OwnerObject] | None,
    now: float,
    hours: float,
) -> tuple[list[Reclamation], float]:
    """Each record one cycle on (``hours`` since the previous cycle); returns the records and the
    GPU-hours returned this cycle. A GPU named by several records in force (pods time-sliced on it,
    reclaimed apart) counts once, for the oldest of them."""
    out: list[Reclamation] = []
    returned = 0.0
    counted: set[str] = set()
    for record in kept(records):
        update: dict[str, object] = {}
        if record.returned:
            if _back(record, pods, owners):
                update["returned"] = False
            else:
                gpus = len(set(record.gpu_ids) - counted) if record.gpu_ids else record.gpus
                counted.update(record.gpu_ids)
                gained = gpus * hours
                returned += gained
                update["gpu_hours_returned"] = record.gpu_hours_returned + gained
        if record.seconds_to_running is None and record.waiting_pods:
            found = _first_running(record, pods, now)
            if found is not None:
                update["running_pod"], update["seconds_to_running"] = found
        out.append(record.model_copy(update=update) if update else record)
    return out, returned


def newly_running(before: Sequence[Reclamation], after: Sequence[Reclamation]) -> list[float]:
    """Seconds to running of the records that got one this cycle (for the histogram)."""
    had = {(r.owner, r.time) for r in before if r.seconds_to_running is not None}
    return [
        r.seconds_to_running
        for r in after
        if r.seconds_to_running is not None and (r.owner, r.time) not in had
    ]


def accepted(records: Sequence[Reclamation], drafts: Sequence[Reclamation]) -> list[Reclamation]:
    """``records`` with the drafts whose action was accepted (or whose outcome is unknown)."""
    return kept([*records, *drafts])


def kept(records: Sequence[Reclamation]) -> list[Reclamation]:
    """The newest ``MAX_IN_FORCE`` records in force and ``MAX_RECORDS`` that ended, in order."""
    in_force = [i for i, r in enumerate(records) if r.returned][-MAX_IN_FORCE:]
    ended = [i for i, r in enumerate(records) if not r.returned][-MAX_RECORDS:]
    return [records[i] for i in sorted((*in_force, *ended))]
