"""gpu-efficiency report on the exporters (issue 30): generations, blind spots with the CSV lines to
add, and "no dcgm-exporter series found" with the matcher used."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.report import build_report, render_table
from gpu_efficiency.runtime.cycle import log_generations
from gpu_efficiency.runtime.observe import no_series_message
from tests.unit.engine import builders as b

DEFAULT_CSV_BLIND = frozenset({"ecc", "pcie", "profiling", "occupancy", "tensor", "dram", "pcie-throughput"})


# ---- gpu-efficiency report ------------------------------------------------------------------------------


def test_report_shows_generations_blind_spots_with_csv_lines_and_no_series_with_the_matcher() -> None:
    gpus = [
        replace(
            b.gpu("GPU-0", b.compute_bound(), ("team-a", "p0")),
            exporter="default-csv",
            blind=DEFAULT_CSV_BLIND,
        )
    ]
    snap = b.snapshot(gpus, [b.pod("p0")])
    report = build_report(snap, plan_cycle(snap))
    assert report["exporters"]["generations"] == {"default-csv": 1}
    table = render_table(report)
    assert "Exporter generations (GPUs): default-csv 1" in table
    assert "Blind spots (unknown, never healthy): ecc 1 GPU," in table
    assert (
        "    DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors." in table
    )
    message = no_series_message('job=~"x"')
    assert message.startswith('no dcgm-exporter series found with the matcher job=~"x"')
    missing = b.snapshot([], [b.pod("p0")], metrics_available=False, metrics_error=message)
    assert "no dcgm-exporter series found with the matcher" in render_table(
        build_report(missing, plan_cycle(missing))
    )
    empty = b.snapshot([], [])  # no GPU pod yet, and no series: still said, with the matcher
    shown = render_table(build_report(empty, plan_cycle(empty), matchers='job=~"x"'))
    assert 'no dcgm-exporter series found with the matcher job=~"x"' in shown


def test_the_generations_are_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_efficiency.runtime.cycle"):
        log_generations("p", {}, {"4.9+": 2, "legacy": 1})
        log_generations("p", {"4.9+": 2, "legacy": 1}, {"4.9+": 2, "legacy": 1})  # unchanged: silent
    assert [r.getMessage() for r in caplog.records] == [
        "policy p: dcgm-exporter generations: 4.9+ 2 GPUs, legacy 1 GPU"
    ]
