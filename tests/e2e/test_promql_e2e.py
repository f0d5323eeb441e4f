"""PromQL the source sends, evaluated by the real Prometheus (issue 7): the single thermal
clock-event comparison must name exactly the values with bit 3, 5 or 6 set; the identity query must
give each GPU its newest sample time (evaluated by ``promtool test rules`` over fixed series); and
queries must arrive as written through the source's own form encoding."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_efficiency.engine.quarantine import thermal as faults_thermal
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.promql import identity_query, thermal_bits_expr, union
from tests.e2e.harness import built_tool, prom_query

pytestmark = pytest.mark.e2e

VALUES = [*range(0, 256), 1000, 4095, 65536 + 8, 65536 + 16, 2**40 + 32, -1, -8, -104]


def test_thermal_bits_expression_in_prometheus(prometheus_url: str) -> None:
    tagged = [f'label_replace(vector({v}), "v", "{v}", "", "")' for v in VALUES]
    query = thermal_bits_expr(f"({union(tagged)})")
    named = {int(labels["v"]) for labels, _ in prom_query(prometheus_url, query, timeout=30)}
    expected = {v for v in VALUES if v >= 0 and v & faults_thermal.THERMAL_BITS}
    assert named == expected


def promtool_eval(
    tmp_path: Path, series: dict[str, str], expr: str, at: str, expected: list[dict[str, Any]]
) -> None:
    """Evaluate ``expr`` at ``at`` over ``series`` (promtool's notation, 15 s apart) in Prometheus'
    own engine (``promtool test rules``); fail with promtool's report unless it gives ``expected``."""
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [{"expr": expr, "eval_time": at, "exp_samples": expected}],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [built_tool("promtool", "PROMTOOL"), "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_identity_query_gives_each_gpu_its_newest_sample_time(tmp_path: Path) -> None:
    """Every GPU any identity metric names, with the newest time of its live series: a GPU with
    only some of the metrics (MIG: no GPU_UTIL), one exported by two targets of which one stopped,
    and one whose GPU_UTIL series went stale while its FB_USED goes on (a scrape marks a vanished
    series stale). Samples are 15 s apart from 0; evaluated at 2m."""
    util, fb, sm = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_SM_ACTIVE"
    series = {
        f'{util}{{UUID="GPU-1",Hostname="n1",pod="a",namespace="ns",instance="x"}}': "50x8",
        f'{fb}{{UUID="GPU-1",Hostname="n1",pod="a",namespace="ns",instance="x"}}': "900x8",
        f'{sm}{{UUID="GPU-1",Hostname="n1",pod="a",namespace="ns",instance="x"}}': "0.5x8",
        f'{fb}{{UUID="GPU-2",GPU_I_ID="1",Hostname="n1",instance="x"}}': "100x8",
        f'{util}{{UUID="GPU-3",Hostname="n2",instance="x"}}': "10x4",  # stopped at 60s, never marked
        f'{util}{{UUID="GPU-3",Hostname="n2",instance="y"}}': "10x7",  # to 105s
        f'{util}{{UUID="GPU-4",Hostname="n2",instance="y"}}': "10x3 stale",
        f'{fb}{{UUID="GPU-4",Hostname="n2",instance="y"}}': "100x6",  # to 90s
    }
    # Each target's series apart (``instance``: the source believes a GPU only from a target on its
    # node); the source takes the newest over a GPU's targets (GPU-3: 105).
    expected = [
        {"labels": '{UUID="GPU-1",Hostname="n1",pod="a",namespace="ns",instance="x"}', "value": 120},
        {"labels": '{UUID="GPU-2",GPU_I_ID="1",Hostname="n1",instance="x"}', "value": 120},
        {"labels": '{UUID="GPU-3",Hostname="n2",instance="x"}', "value": 60},
        {"labels": '{UUID="GPU-3",Hostname="n2",instance="y"}', "value": 105},
        {"labels": '{UUID="GPU-4",Hostname="n2",instance="y"}', "value": 90},
    ]
    promtool_eval(tmp_path, series, identity_query(timestamps=True).text, "2m", expected)
    # and the check can fail: a wrong newest time is reported
    wrong = [*expected[:4], {**expected[4], "value": 45}]
    with pytest.raises(AssertionError, match="GPU-4"):
        promtool_eval(tmp_path, series, identity_query(timestamps=True).text, "2m", wrong)


def test_queries_with_form_special_characters_reach_prometheus_intact(prometheus_url: str) -> None:
    """The source escapes only what a form parser reads specially (``form_value``): '%', '+', '&',
    ';' and '=' in a query, and non-ASCII text, must arrive as written."""
    source = PrometheusSource(PrometheusConfig(url=prometheus_url))
    assert source.query("vector(7 % 4 + 1) * 2") == [({}, 8.0)]
    text = "a;b&c=d+e%f é #g"
    assert source.query(f'label_replace(vector(1), "x", "{text}", "", "")') == [({"x": text}, 1.0)]
