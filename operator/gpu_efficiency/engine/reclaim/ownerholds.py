"""Reclamations that did not hold, and the owners left alone after them (policy status ``ownerHolds``).

Two ways a reclamation can fail to free a GPU for long, and what is done instead of fighting:

* **ReclaimReverted**: an owner we scaled to zero (or suspended, or stopped) is back in service while
  it still carries our ``reclaimed`` record, so it was not ``gpu-efficiency restore``: a GitOps tool
  (Argo CD self-heal, Flux) or a person put ``spec.replicas`` back. Reclaiming again would fight that
  controller every interval, so the owner is left alone for a back-off that doubles with each revert
  (the first as long as one reclaim takes, idleFor + warningPeriod), capped at ``maxKeep``.
* **ReclaimIneffective**: the pods of an owner we cannot act on were evicted (nothing we know
  recreates them), yet a pod of the same controller came back and is idle again. Evicting again
  would loop, so the owner is left alone for ``maxKeep`` and an admin is told (event, status count).

Only this policy's ``status.reclamations`` prove a reclamation was ours: an owner annotation alone
proves nothing. Each record is reported at most once (its time is kept in the hold), and the holds
live in the policy status, so a restart neither forgets nor repeats them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.policy import ReclaimAction
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus, OwnerHold, Reclamation
from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339
from gpu_efficiency.engine.model import OwnerKey, OwnerObject, PodView
from gpu_efficiency.engine.params import CycleParams
from gpu_efficiency.engine.reclaim.owners import in_reclaimed_state
from gpu_efficiency.engine.reclaim.reclaimproof import owner_text

#: Holds kept in status at most (newest kept): a bound on the status size, not a rule.
MAX_HOLDS = 50
#: The field a GitOps tool should leave alone, per owner action.
_FIELD: Mapping[str, str] = {
    ReclaimAction.SCALE_TO_ZERO.value: "spec.replicas",
    ReclaimAction.SUSPEND.value: "spec.suspend",
    ReclaimAction.STOP.value: f"the {names.KUBEFLOW_STOPPED} annotation",
}


def active_hold(holds: Iterable[OwnerHold], key: OwnerKey, now: float) -> OwnerHold | None:
    """The hold that leaves ``key`` alone now, if any."""
    text = owner_text(key)
    for hold in holds:
        until = parse_rfc3339(hold.until)
        if hold.owner == text and until is not None and now < until:
            return hold
    return None


def hold_text(hold: OwnerHold) -> str:
    if hold.reason == names.EV_RECLAIM_REVERTED:
        return (
            f"reclaimed before and scaled back without restore ({hold.reason} x{hold.count}): "
            f"not reclaimed again before {hold.until}"
        )
    return (
        f"its evicted pods came back and went idle again ({hold.reason}): left alone until {hold.until} "
        "or until an admin removes it from the policy's status.ownerHolds"
    )


def _latest(records: Sequence[Reclamation], text: str, actions: Iterable[str]) -> Reclamation | None:
    wanted = set(actions)
    found = [r for r in records if r.owner == text and r.action in wanted]
    return found[-1] if found else None


def _reported(holds: Iterable[OwnerHold], text: str, record: Reclamation) -> bool:
    return any(h.owner == text and h.reclaimed_at == record.time for h in holds)


@dataclass(frozen=True, slots=True)
class Revert:
    """An owner of ours back in service without restore."""

    obj: OwnerObject
    record: Reclamation
    hold: OwnerHold
    message: str


def gitops_hint(kind: str, action: str) -> str:
    field = _FIELD.get(action, "the field we changed")
    return (
        f"if a GitOps tool manages this {kind}, let it ignore {field} differences "
        "(Argo CD: ignoreDifferences with jsonPointers [/spec/replicas] and the sync option "
        "RespectIgnoreDifferences=true; Flux: leave the field out of the manifest in Git, as for an HPA), "
        "or exempt it where the policy allows"
    )


def find_reverts(
    records: Sequence[Reclamation],
    holds: Sequence[OwnerHold],
    owners: Mapping[OwnerKey, OwnerObject],
    params: CycleParams,
    now: float,
) -> list[Revert]:
    """Owners this policy reclaimed (status.reclamations) that are out of their reclaimed state while
    still carrying our ``reclaimed`` record (``restore`` removes it), each reported once."""
    out: list[Revert] = []
    seen: set[str] = set()
    for record in reversed(records):
        if record.owner in seen or record.action not in _FIELD:
            continue
        seen.add(record.owner)
        namespace, kind, name = record.owner.split("/", 2)
        obj = owners.get((namespace, kind, name))
        if obj is None or (record.uid and obj.ref.uid != record.uid):
            continue  # gone, or a same-named successor: not the owner we reclaimed
        if obj.annotations.get(names.RECLAIMED) != record.action or in_reclaimed_state(obj, record.action):
            continue
        if _reported(holds, record.owner, record):
            continue
        before = [h for h in holds if h.owner == record.owner and h.reason == names.EV_RECLAIM_REVERTED]
        count = before[-1].count + 1 if before else 1
        base = params.idle_for_s + params.warning_period_s
        backoff = min(params.max_keep_s, base * 2 ** (count - 1))
        hold = OwnerHold(
            owner=record.owner,
            reason=names.EV_RECLAIM_REVERTED,
            reclaimed_at=record.time,
            since=format_rfc3339(now),
            until=format_rfc3339(now + backoff),
            count=count,
        )
        label = f"{kind.lower()}/{name}"
        message = (
            f"{label} was reclaimed ({record.action}) at {record.time} and is back without "
            f"gpu-efficiency restore: not reclaimed again for {format_duration(backoff)} (until {hold.until}; "
            f"back-off doubles with each revert, at most maxKeep). {gitops_hint(kind, record.action)}"
        )
        out.append(Revert(obj, record, hold, message))
    return out


def came_back(
    key: OwnerKey, pods: Sequence[PodView], records: Sequence[Reclamation], holds: Sequence[OwnerHold]
) -> Reclamation | None:
    """The eviction of ours (status.reclamations) of ``key``'s pods that its pods outlived: a pod of
    the same controller that started after it (or has not started). None when already reported."""
    text = owner_text(key)
    record = _latest(records, text, (ReclaimAction.EVICT.value,))
    if record is None or _reported(holds, text, record):
        return None
    since = parse_rfc3339(record.time)
    if since is None:
        return None
    if any(p.start_time is None or p.start_time >= since for p in pods):
        return record
    return None


def ineffective_hold(key: OwnerKey, record: Reclamation, params: CycleParams, now: float) -> OwnerHold:
    return OwnerHold(
        owner=owner_text(key),
        reason=names.EV_RECLAIM_INEFFECTIVE,
        reclaimed_at=record.time,
        since=format_rfc3339(now),
        until=format_rfc3339(now + params.max_keep_s),
    )


def merged_holds(
    holds: Sequence[OwnerHold], new: Sequence[OwnerHold], now: float, keep_s: float
) -> list[OwnerHold]:
    """The holds with ``new`` added (replacing the owner's older one of the same reason); a hold
    ended more than ``keep_s`` ago is dropped (a revert after that starts the back-off afresh)."""
    replaced = {(h.owner, h.reason) for h in new}
    kept = [
        h
        for h in holds
        if (h.owner, h.reason) not in replaced and (parse_rfc3339(h.until) or 0.0) + keep_s > now
    ]
    return [*kept, *new][-MAX_HOLDS:]


def with_holds(
    status: GPUEfficiencyPolicyStatus, new: Sequence[OwnerHold], now: float, keep_s: float
) -> GPUEfficiencyPolicyStatus:
    """``status`` with this cycle's new holds and their counts (from the snapshot, not from an API
    outcome: nothing is written to the owner, so the plan's status says it)."""
    holds = merged_holds(status.owner_holds, new, now, keep_s)
    if not new and holds == status.owner_holds:
        return status
    reverted = sum(h.reason == names.EV_RECLAIM_REVERTED for h in new)
    return status.model_copy(
        update={
            "owner_holds": holds,
            "reclaims_reverted_total": status.reclaims_reverted_total + reverted,
            "reclaims_ineffective_total": status.reclaims_ineffective_total + len(new) - reverted,
        }
    )
