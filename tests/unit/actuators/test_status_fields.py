"""Issue 31.6: the policy status is read field by field. A field the CRD's schema lets through but
the model rejects (``reclamations: [{}]``) is dropped alone and reported; the eviction budget's
history (``recentEvictions``) and every other field are kept."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from tests.unit.engine import builders as b
from tests.unit.runtime.cycle_harness import ENFORCE_SPEC, runner

from gpu_efficiency.actuators.status import StatusWriter, parse_status, read_status
from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import PolicyEvent

RECENT = [format_rfc3339(b.NOW - 600), format_rfc3339(b.NOW - 300)]
GOOD = {"owner": "ml/Deployment/nb", "uid": "u-nb", "action": "ScaleToZero", "time": RECENT[0], "replicas": 2}


def test_one_bad_record_drops_only_itself() -> None:
    raw: dict[str, Any] = {"recentEvictions": RECENT, "evictionsTotal": 7, "reclamations": [{}, GOOD]}
    status, problems = read_status(raw)
    assert status.recent_evictions == RECENT
    assert status.evictions_total == 7
    assert [r.uid for r in status.reclamations] == ["u-nb"]
    assert len(problems) == 1
    assert problems[0].startswith("status.reclamations[0]: ")
    assert parse_status(raw).recent_evictions == RECENT


def test_a_bad_scalar_field_is_dropped_and_the_rest_kept() -> None:
    status, problems = read_status({"idleGpuHours": "lots", "recentEvictions": RECENT, "someNewField": 1})
    assert status.recent_evictions == RECENT
    assert status.idle_gpu_hours == 0.0
    assert [p.split(":", 1)[0] for p in problems] == ["status.idleGpuHours"]
    assert read_status({"recentEvictions": [RECENT[0], 3]})[0].recent_evictions == [RECENT[0]]


def test_the_cycle_reports_the_dropped_field_once_and_keeps_the_budget() -> None:
    cycle = runner([b.gpu("GPU-0", b.compute_bound(), ("team-a", "p0"))], [b.pod("p0")])
    raw: dict[str, Any] = {"recentEvictions": RECENT, "reclamations": [{}, GOOD]}
    writer = cycle.status_writer

    def read_from_server(name: str) -> Any:  # as StatusWriter.read: the server holds ``raw``
        status, problems = read_status(raw)
        writer.problems[name] = problems
        return status

    writer.read = read_from_server  # type: ignore[method-assign]
    cycle.run(name="p", uid="uid-p", generation=1, spec_raw=ENFORCE_SPEC, status_raw=raw)
    status = cycle.status_writer.written["p"]  # type: ignore[attr-defined]
    assert status.recent_evictions == RECENT
    assert [r.uid for r in status.reclamations] == ["u-nb"]
    valid = next(c for c in status.conditions if c.type == names.COND_STATUS_VALID)
    assert (valid.status, valid.reason) == ("False", "FieldsUnreadable")
    assert "status.reclamations[0]" in valid.message
    events = [a for a in cycle.applier.applied if isinstance(a, PolicyEvent)]  # type: ignore[attr-defined]
    assert [e.reason for e in events if e.reason == names.EV_STATUS_FIELD_INVALID] == [
        names.EV_STATUS_FIELD_INVALID
    ]
    cycle.run(name="p", uid="uid-p", generation=1, spec_raw=ENFORCE_SPEC, status_raw=raw)
    again = cycle.status_writer.written["p"]  # type: ignore[attr-defined]
    assert next(c for c in again.conditions if c.type == names.COND_STATUS_VALID).status == "True"
    events = [a for a in cycle.applier.applied if isinstance(a, PolicyEvent)]  # type: ignore[attr-defined]
    assert len([e for e in events if e.reason == names.EV_STATUS_FIELD_INVALID]) == 1


class OneObject:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    def get_cluster_custom_object(self, *_: object) -> dict[str, Any]:
        return self.obj


def test_the_status_writer_keeps_what_it_could_not_read_for_the_cycle_to_report() -> None:
    writer = StatusWriter(client.ApiClient())
    raw = {"recentEvictions": RECENT, "reclamations": [{}]}
    writer.custom = OneObject({"metadata": {"resourceVersion": "5"}, "status": raw})  # type: ignore[assignment]
    status = writer.read("p")
    assert status is not None
    assert status.recent_evictions == RECENT
    assert [p.split(":", 1)[0] for p in writer.problems["p"]] == ["status.reclamations[0]"]
