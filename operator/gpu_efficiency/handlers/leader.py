"""Leader election with a coordination.k8s.io Lease, so that of N replicas exactly one acts.

Kopf's peering is priority-based (equal priorities all freeze), so replicas run Kopf standalone and
gate every cycle on this lease instead. Updates carry the lease's resourceVersion: two candidates
racing for an expired lease cannot both win. A replica that cannot renew stops acting when its
term ends, before another can take over.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds = lease_seconds
        self._valid_until = 0.0  # monotonic deadline of our current term
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions = 0
        self._warned_missing = False

    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Step down and release the lease so a peer takes over at once."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.is_leader():
            self._release()
        self._valid_until = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as exc:  # network trouble: keep the term we have, retry soon
                log.warning("leader election: %s", exc)
            self._stop.wait(self.lease_seconds / 3)

    def try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        now = _now()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(now, started)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or int(self.lease_seconds)
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            self._valid_until = 0.0
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(self.lease_seconds)
        lease.spec = spec
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first
                self._valid_until = 0.0
                return False
            raise
        self._won(holder, started)
        return True

    def _create(self, now: datetime, started: float) -> bool:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self.lease_seconds),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status == 404 and not self._warned_missing:
                self._warned_missing = True
                log.error(
                    "leader election: namespace %r does not exist, so this replica never acts; "
                    "create it, pass --namespace, or run a single replica with --no-leader-election",
                    self.namespace,
                )
            raise
        self._won("", started)
        return True

    def _won(self, previous_holder: str, started: float) -> None:
        if not self.is_leader():
            self.transitions += 1
            log.info(
                "became leader (lease %s/%s, previous holder %r)", self.namespace, self.name, previous_holder
            )
        # Count the term from before the request, so clock skew cannot stretch it.
        self._valid_until = started + self.lease_seconds * 2 / 3

    def _release(self) -> None:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.renew_time = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            log.warning("could not release the lease: %s", exc)


class AlwaysLeader:
    """For a single replica run without leader election."""

    def is_leader(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None
