"""The faults engine skips quiet nodes' GPUs that carry no fault window: the outcome never changes.

Sources that fetch fault windows only for GPUs that may be faulted leave most GPUs without them; the
engine then judges only the GPUs that matter. Over several cycles on random clusters (faults,
recoveries, garbage, GPUs without fault windows, foreign taints), the outcome with the shortcut
equals the outcome of judging every GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as s
from tests.unit.engine.quarantine.support import Cluster, gpu, node, of_type, policy
from tests.unit.engine.quarantine.test_properties import FAULTY, FOREIGN, HARMLESS
from tests.unit.positive_control import reached

from gpu_efficiency.engine.model import FaultOutcome, GPUSample, TaintNode, UntaintNode, Window
from gpu_efficiency.engine.quarantine import evaluate as faults


def _unfetched(sample: GPUSample) -> GPUSample:
    return replace(sample, stats={w: v for w, v in sample.stats.items() if w not in faults.FAULT_WINDOWS})


PROFILES = sorted(FAULTY) + sorted(HARMLESS) + ["unfetched"]
clusters = s.lists(
    s.tuples(s.lists(s.sampled_from(PROFILES), min_size=1, max_size=3), s.booleans()),
    min_size=1,
    max_size=8,
)


def _gpus(spec: list[tuple[list[str], bool]]) -> list[GPUSample]:
    out = []
    for n, (profiles, _) in enumerate(spec):
        for index, profile in enumerate(profiles):
            if profile == "unfetched":
                out.append(_unfetched(gpu(f"n{n:02d}", index)))
            else:
                out.append(gpu(f"n{n:02d}", index, **(FAULTY | HARMLESS)[profile]))
    return out


def _run(spec: list[tuple[list[str], bool]], enforce: bool, shortcut: bool) -> list[FaultOutcome]:
    views = [node(f"n{n:02d}", taints=(FOREIGN,) if foreign else ()) for n, (_, foreign) in enumerate(spec)]
    cluster = Cluster.of(*views, spec=policy("Enforce" if enforce else "Observe"))
    gpus = _gpus(spec)
    healthy_later = [_unfetched(g) for g in gpus]  # the faults stop being fetched: recoveries follow
    patch: Any = mock.patch.object(faults, "_quiet", return_value=False) if not shortcut else mock.MagicMock()
    with patch:
        first = [cluster.cycle(gpus, advance=30.0) for _ in range(3)]
        return first + [cluster.cycle(healthy_later, advance=600.0) for _ in range(2)]


@settings(max_examples=60, deadline=None)
@given(spec=clusters, enforce=s.booleans())
def test_shortcut_never_changes_the_outcome(spec: list[tuple[list[str], bool]], enforce: bool) -> None:
    assert _run(spec, enforce, shortcut=True) == _run(spec, enforce, shortcut=False)


def test_control_the_generator_reaches_taints() -> None:
    """Equal outcomes would also be equal if both were empty: the same generator must reach runs
    that taint a node. (It never reaches an untaint: with the fault windows no longer fetched, the
    held faults have no data to recover on, and absence of data is never health, safety rule 1.)"""

    def taints(spec: list[tuple[list[str], bool]]) -> bool:
        actions = [a for o in _run(spec, True, shortcut=True) for a in o.actions]
        return bool(of_type(actions, TaintNode))

    spec = reached(clusters, taints, tries=200)
    later = [a for o in _run(spec, True, shortcut=True)[3:] for a in o.actions]
    assert of_type(later, UntaintNode) == []


def test_quiet_node_without_fault_windows_is_not_judged() -> None:
    cluster = Cluster.of(node("n00"), node("n01"), spec=policy("Enforce"))
    judged: list[str] = []
    original = faults.judge_gpus

    def spy(gpus: Any, *args: Any) -> Any:
        gpus = list(gpus)
        judged.extend(g.uuid for g in gpus)
        return original(gpus, *args)

    with mock.patch.object(faults, "judge_gpus", spy):
        outcome = cluster.cycle([_unfetched(gpu("n00", 0)), gpu("n01", 0, **FAULTY["dbe"])])
    assert judged == ["GPU-n01-0"]
    assert [q.node for q in outcome.quarantined] == ["n01"]
    assert Window.FAULT in gpu("n00", 0).stats  # the builder's GPUs do carry fault windows
