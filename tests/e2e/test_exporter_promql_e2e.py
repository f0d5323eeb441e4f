"""Every dcgm-exporter generation's series through the operator's PromQL, in Prometheus' own engine
(``promtool test rules``, issue 30): a 0-1 GPU_UTIL_RATIO reaches the engine in percent, a GPU
serving both names is read once, the inventory tells each GPU's features, and XIDs are counted
from the exporter's windowed counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_efficiency.engine.model import Signal
from gpu_efficiency.sources.metrics.prometheus import exporter_inventory as inv
from gpu_efficiency.sources.metrics.prometheus import xid_counts
from gpu_efficiency.sources.metrics.prometheus.promql import _term, idle_candidates_query
from tests.e2e.test_promql_e2e import promtool_eval

pytestmark = pytest.mark.e2e

UTIL, RATIO = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"


def test_gpu_util_reaches_the_engine_in_percent_from_either_name_and_once(tmp_path: Path) -> None:
    series = {
        f'{RATIO}{{UUID="GPU-1",hostname="n1",instance="a"}}': "0.9x8",  # 4.9+: a busy GPU, as a ratio
        f'{UTIL}{{UUID="GPU-2",Hostname="n2",instance="b"}}': "90x8",  # legacy: percent
        f'{UTIL}{{UUID="GPU-3",Hostname="n3",instance="c"}}': "50x8",  # both names, one target
        f'{RATIO}{{UUID="GPU-3",hostname="n3",instance="c"}}': "0.5x8",
        f'{UTIL}{{UUID="GPU-4",Hostname="n4",instance="d"}}': "50x8",  # both names, two targets
        f'{RATIO}{{UUID="GPU-4",hostname="n4",instance="e"}}': "0.5x8",
    }
    tag = 'gpueff_agg="GPU_UTIL:max"'
    expected = [
        {"labels": f'{{UUID="GPU-1",{tag}}}', "value": 90},
        {"labels": f'{{UUID="GPU-2",{tag}}}', "value": 90},
        {"labels": f'{{UUID="GPU-3",{tag}}}', "value": 50},
        {"labels": f'{{UUID="GPU-4",{tag}}}', "value": 50},
    ]
    promtool_eval(tmp_path, series, _term(Signal.GPU_UTIL, "max", 120, ""), "2m", expected)
    counted = [
        {**e, "labels": e["labels"].replace("GPU_UTIL:max", "GPU_UTIL:count"), "value": 8} for e in expected
    ]
    promtool_eval(tmp_path, series, _term(Signal.GPU_UTIL, "count", 120, ""), "2m", counted)  # read once
    # no busy GPU is an idle candidate at a 1 % threshold, whichever its unit
    promtool_eval(tmp_path, series, idle_candidates_query(120, 0.01).text, "2m", [])


def test_the_inventory_tells_each_gpus_features(tmp_path: Path) -> None:
    series = {
        f'{RATIO}{{UUID="GPU-1",hostname="n1"}}': "0.5x8",
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{UUID="GPU-1",hostname="n1"}': "0x8",
        f'{UTIL}{{UUID="GPU-2",Hostname="n2"}}': "50x8",
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{UUID="GPU-2",Hostname="n2"}': "0x8",
    }
    one = inv.BITS["current-names"] | inv.BITS["label-hostname"] | inv.BITS["ecc"]
    two = inv.BITS["legacy-names"] | inv.BITS["label-Hostname"] | inv.BITS["throttle-name"]
    two |= inv.BITS["thermal"] | inv.BITS["clock-events"]
    expected = [{"labels": '{UUID="GPU-1"}', "value": one}, {"labels": '{UUID="GPU-2"}', "value": two}]
    promtool_eval(tmp_path, series, inv.inventory_query(), "2m", expected)
    assert inv.view_of(one).generation.value == "4.9+"
    assert inv.view_of(two).generation.value == "default-csv"  # no ECC, no SM_OCCUPANCY


def test_xid_events_are_the_windowed_counters_positive_steps(tmp_path: Path) -> None:
    """dcgm-exporter's count of XID 79 in its last 5 minutes: a series born at 60 s (1 event), a
    second event at 90 s, the first leaving the window at 135 s: 2 events within 3 minutes, and the
    zero-valued series without an ``xid`` label counts nothing."""
    series = {
        'DCGM_EXP_XID_ERRORS_COUNT{UUID="GPU-1",xid="79"}': "_ _ _ _ 1 1 2 2 2 1 1 1 1",
        'DCGM_EXP_XID_ERRORS_COUNT{UUID="GPU-1"}': "0x12",
    }
    query = xid_counts.query([180.0])
    assert query is not None
    expected = [{"labels": '{UUID="GPU-1",xid="79",gpueff_within="180"}', "value": 2}]
    promtool_eval(tmp_path, series, query.text, "3m", expected)


def test_a_window_query_reads_every_renamed_field(tmp_path: Path) -> None:
    """A 4.9+ GPU's DCGM 4.6 names fill the same aggregates a legacy GPU's names do."""
    series = {
        'DCGM_FI_PROF_SM_UTIL_RATIO{UUID="GPU-1"}': "0.5x8",
        'DCGM_FI_DEV_GPU_TEMP_CELSIUS{UUID="GPU-1"}': "70x8",
        'DCGM_FI_DEV_BOARD_POWER_WATTS{UUID="GPU-1"}': "300x8",
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-2"}': "0.5x8",
        'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-2"}': "70x8",
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-2"}': "300x8",
    }
    for signal, value in ((Signal.SM_ACTIVE, 0.5), (Signal.GPU_TEMP, 70), (Signal.POWER, 300)):
        tag = f'gpueff_agg="{signal.name}:max"'
        expected = [{"labels": f'{{UUID="GPU-{i}",{tag}}}', "value": value} for i in (1, 2)]
        promtool_eval(tmp_path, series, _term(signal, "max", 120, ""), "2m", expected)
