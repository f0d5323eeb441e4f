"""Was this owner reclaimed by us? Only our own status record can say.

The ``gpuefficiency.io/reclaimed`` annotation sits on an object its user may edit: a tenant can
write it on a decoy Deployment at 0 replicas and point a pod's controller reference at it. Taken as
proof, that decoy would hold an idle GPU for ever ("already reclaimed") and make OnPressure count
the pod's GPUs as being freed. So an owner counts as reclaimed by this operator only when a policy's
``status.reclamations`` (written by the operator alone: the status subresource) holds a record in
force for that object's uid. The engine (owner resolution, the OnPressure fit check) and
``gpu-efficiency restore`` ask the same question here.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_efficiency.api.status import Reclamation


def reclaimed_by_us(uid: str, records: Iterable[Reclamation]) -> Reclamation | None:
    """The newest record in force of our reclamation of the object with ``uid`` (None: no proof).

    A record that ended (the owner was seen restored or recreated its pods) proves nothing any
    more, and neither does an empty uid (records written before uids were kept)."""
    if not uid:
        return None
    found = None
    for record in records:
        if record.uid == uid and record.returned:
            found = record
    return found
