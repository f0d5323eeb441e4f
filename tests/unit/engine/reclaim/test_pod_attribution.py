"""GPU series without pod labels: every pod Unknown, and the policy says metrics are missing.

The exporter answers (Prometheus is up, GPUs have samples) but no series names a pod in scope, as
with a dcgm-exporter not configured for pod attribution: no pod can be judged, so MetricsAvailable
is False with one MetricsUnavailable event, like a Prometheus outage, instead of a silent Unknown.
"""

from dataclasses import replace

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import NOW, apply_plan, enforce, gpu, no_faults, pod, snapshot  # noqa: F401 (fixture)

from gpu_efficiency.api import names
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, PolicyEvent, Verdict
from gpu_efficiency.engine.planner import plan_cycle

pytestmark = pytest.mark.usefixtures("no_faults")


def _metrics(plan_status: object) -> tuple[str, str, str]:
    conditions = {c.type: c for c in plan_status.conditions}  # type: ignore[attr-defined]
    cond = conditions[names.COND_METRICS]
    return cond.status, cond.reason, cond.message


def test_gpus_without_pod_labels_make_metrics_unavailable_once_and_never_evict() -> None:
    warned = {names.IDLE_SINCE: format_rfc3339(NOW - 3600), names.EVICT_AFTER: format_rfc3339(NOW - 60)}
    snap = snapshot(
        [gpu("GPU-0", b.idle()), gpu("GPU-1", b.idle())],  # samples, but no pod on either
        [pod("p", annotations=warned), pod("q")],
        enforce(),
    )
    plan = plan_cycle(snap)
    assert all(v.verdict is Verdict.UNKNOWN for v in plan.verdicts)
    assert not [a for a in plan.actions if isinstance(a, EvictPod)]
    status, reason, message = _metrics(plan.status)
    assert (status, reason) == ("False", "NoPodSamples")
    assert "2 GPUs have samples but none is attributed to the 2 pod(s) in scope" in message
    events = [a for a in plan.actions if isinstance(a, PolicyEvent)]
    assert [(e.reason, e.type) for e in events] == [(names.EV_METRICS_UNAVAILABLE, "Warning")]
    # the next cycle: still False, no second event
    again = plan_cycle(apply_plan(snap, plan))
    assert _metrics(again.status)[0] == "False"
    assert not [a for a in again.actions if isinstance(a, PolicyEvent)]


def test_one_attributed_pod_is_enough_and_young_pods_do_not_count() -> None:
    gpus = [gpu("GPU-0", b.compute_bound(), ("team-a", "p")), gpu("GPU-1", b.idle())]
    plan = plan_cycle(snapshot(gpus, [pod("p"), pod("q")]))
    assert _metrics(plan.status)[:2] == ("True", "MetricsRead")
    # only warming-up pods in scope: nothing could be judged yet anyway, so no alarm
    young = plan_cycle(snapshot([gpu("GPU-1", b.idle())], [pod("q", start_time=NOW - 5)]))
    assert _metrics(young.status)[:2] == ("True", "MetricsRead")


def test_pod_labels_coming_back_flip_the_condition_to_true() -> None:
    snap = snapshot([gpu("GPU-0", b.compute_bound())], [pod("p")])
    down = plan_cycle(snap)
    assert _metrics(down.status)[0] == "False"
    back = replace(snap, gpus=(gpu("GPU-0", b.compute_bound(), ("team-a", "p")),), status=down.status)
    up = plan_cycle(back)
    assert _metrics(up.status)[:2] == ("True", "MetricsRead")
    assert [a for a in up.actions if isinstance(a, AnnotatePod)], "the pod is judged again"
