"""The policies' statuses as this replica holds them, so the eviction budget is never lost.

A cycle's status is kept here before it is written (a failed write is retried next cycle), each
leadership term starts by re-reading the policy's status from the server and merging it with what
this replica holds, and a write that meets a newer status (409) re-reads and merges before its one
retry (``engine.merge_budgets``: the union of both sides' recent evictions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_efficiency import engine, metrics
from gpu_efficiency.actuators.status import StatusWriter, read_status
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus

log = logging.getLogger(__name__)


@dataclass
class StatusBook:
    writer: StatusWriter
    clock: Callable[[], float]
    _last: dict[str, GPUEfficiencyPolicyStatus] = field(default_factory=dict)
    _terms: dict[str, int] = field(default_factory=dict)  # per policy: the term its status was read in

    def previous(self, name: str, status_raw: Mapping[str, Any]) -> GPUEfficiencyPolicyStatus:
        """The status this replica holds, else the one the event carried (fields that could not be
        read are dropped and reported by the next cycle)."""
        if name in self._last:
            return self._last[name]
        previous, problems = read_status(status_raw)
        if problems:
            self.writer.problems[name] = problems
        self.writer.seed(name, previous.model_dump(by_alias=True, mode="json"))
        return previous

    def last(self, name: str) -> GPUEfficiencyPolicyStatus | None:
        return self._last.get(name)

    def keep(self, name: str, status: GPUEfficiencyPolicyStatus) -> None:
        self._last[name] = status

    def forget(self, name: str) -> None:
        self._last.pop(name, None)
        self._terms.pop(name, None)
        self.writer.forget(name)

    def start_term(self, name: str, term: int) -> bool:
        """At the first cycle of a leadership term: the server's status, with this replica's own
        budget record merged in (evictions it counted but could not write). False: not read."""
        if self._terms.get(name) == term:
            return True
        try:
            server = self.writer.read(name)
        except Exception as exc:
            log.warning("policy %s: could not read its status at the start of the term: %s", name, exc)
            return False
        if server is None:
            return False  # the policy is gone; its deletion reaches the scheduler next
        local = self._last.get(name)
        self._last[name] = server if local is None else engine.merge_budgets(server, local, self.clock())
        self._terms[name] = term
        return True

    def write(self, name: str, status: GPUEfficiencyPolicyStatus) -> tuple[GPUEfficiencyPolicyStatus, bool]:
        """Write the status; it is kept in memory first, so a failed write is retried next cycle
        with nothing lost. A conflict (another writer since our last read) is merged and retried
        once. Returns the status kept and whether a write was made."""
        self._last[name] = status
        metrics.STATUS_WRITES_FAILED.labels(name)  # exported at 0 from the first cycle, so rate() works
        try:
            try:
                wrote = self.writer.write(name, status)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                server = self.writer.read(name)
                if server is None:
                    return status, False
                status = self._last[name] = engine.merge_budgets(status, server, self.clock())
                wrote = self.writer.write(name, status)
        except Exception as exc:
            metrics.STATUS_WRITES_FAILED.labels(name).inc()
            log.warning("policy %s: status write failed, kept and retried next cycle: %s", name, exc)
            return status, False
        return status, bool(wrote)
