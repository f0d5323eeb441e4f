"""Leader election with a coordination.k8s.io Lease, so that of N replicas exactly one acts.

Kopf's peering is priority-based (equal priorities all freeze), so replicas run Kopf standalone and
gate every cycle on this lease instead. Updates carry the lease's resourceVersion: two candidates
racing for an expired lease cannot both win. A replica that cannot renew stops acting when its
term ends, before another can take over.

No decision reads another host's wall clock (``renewTime`` is written for people only). As in
client-go, a candidate measures a foreign lease's age on its own monotonic clock, from the moment
it last saw the lease record change; the holder counts its term from before the request that won
it. With clocks skewed by any amount, the holder's term (2/3 of the duration) ends before any peer
can see the lease as expired (a full duration after it last changed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _now,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds = lease_seconds
        self._monotonic, self._wall = monotonic, wall
        self._valid_until = 0.0  # monotonic deadline of our current term
        self._observed: tuple[object, ...] | None = None  # the lease record as last read
        self._observed_at = 0.0  # monotonic time it was first seen in that form
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions = 0
        self._warned_missing = False

    def is_leader(self) -> bool:
        return self._monotonic() < self._valid_until

    def still_leader(self) -> bool:
        """The guard the actuators call right before each write: the term may end mid-cycle."""
        return self.is_leader()

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

    def _observe(self, spec: client.V1LeaseSpec, at: float) -> float:
        """When (monotonic) this lease record was first seen as it is now."""
        record = (
            spec.holder_identity,
            spec.renew_time,
            spec.acquire_time,
            spec.lease_duration_seconds,
            spec.lease_transitions,
        )
        if record != self._observed:
            self._observed, self._observed_at = record, at
        return self._observed_at

    def try_acquire_or_renew(self) -> bool:
        started = self._monotonic()
        now = self._wall()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(now, started)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or int(self.lease_seconds)
        unchanged_since = self._observe(spec, started)
        expired = started - unchanged_since > duration
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
        self._observe(spec, started)
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

    transitions = 1  # one term, from start-up

    def is_leader(self) -> bool:
        return True

    def still_leader(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None
