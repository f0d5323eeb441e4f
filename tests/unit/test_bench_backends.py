"""The scale bench's ``--metrics`` list and the fault bench's latency offset: what each backend's
operator is pointed at, and which processes' CPU is its cost (a figure in bench/scale/RESULTS.md is
only as right as the URL it was measured against)."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.test_bench_imports import BENCH, load_script


def _load(script: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script(script, monkeypatch, BENCH)  # the scale scripts import bench/ modules too


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _load(BENCH / "scale" / "run.py", monkeypatch)


def test_backends_list_first_is_the_clusters_own_and_budgets_default(run: ModuleType) -> None:
    backends = run.parse_backends("prometheus,victoriametrics-cluster,prometheus@500", 0)
    assert [(b.name, b.refresh_budget, b.label) for b in backends] == [
        ("prometheus", 0, "prometheus"),
        ("victoriametrics-cluster", 0, "victoriametrics-cluster"),
        ("prometheus", 500, "prometheus@500"),
    ]
    assert [b.refresh_budget for b in run.parse_backends("victoriametrics", 7)] == [7]


@pytest.mark.parametrize(
    "spec", ["thanos", "prometheus,prometheus", "prometheus@lots", "prometheus@500,prometheus@500"]
)
def test_bad_backend_lists_are_refused(run: ModuleType, spec: str) -> None:
    with pytest.raises(SystemExit):
        run.parse_backends(spec, 0)


def test_backend_urls_follow_the_scale_clusters_ports(run: ModuleType) -> None:
    env = dict(run.SCALE_ENV)
    single = run.backend_urls(env, run.Backend("victoriametrics", "", ()))
    assert single.url == "http://127.0.0.1:61428"
    assert single.cpu_urls == ("http://127.0.0.1:61428",)
    vmc = run.backend_urls(env, run.Backend("victoriametrics-cluster", "", (), 3))
    assert vmc.url == "http://127.0.0.1:61481/select/0/prometheus"
    assert vmc.refresh_budget == 3
    # every process of the cluster: vmselect, vminsert, vmagent, both vmstorage (cluster.sh: base+10N)
    assert vmc.cpu_urls == (
        "http://127.0.0.1:61481",
        "http://127.0.0.1:61480",
        "http://127.0.0.1:61429",
        "http://127.0.0.1:61510",
        "http://127.0.0.1:61520",
    )
    assert run.backend_urls(env, run.Backend("prometheus", "", ())).url == "http://127.0.0.1:61090"


def test_fault_bench_floor_grows_by_the_latency_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    fault = _load(BENCH / "fault_latency.py", monkeypatch)
    on = argparse.Namespace
    assert fault.vm_offset_s(on(metrics="prometheus", vm_latency_offset=None)) == 0.0
    assert fault.vm_offset_s(on(metrics="victoriametrics", vm_latency_offset=None)) == 2.0
    assert fault.vm_offset_s(on(metrics="victoriametrics-cluster", vm_latency_offset="30s")) == 30.0
    with pytest.raises(SystemExit):
        fault.main(["--metrics", "prometheus", "--vm-latency-offset", "30s"])
