"""The chart's dashboard and recording rules read every dcgm-exporter generation alike.

``promtool test rules`` (Prometheus' own engine, built into the local-cluster cache) evaluates the
dashboard's DCGM panels and the ``gpuefficiency:dcgm_*`` recording rules over one GPU of each
generation the simulator serves: legacy and 4.x (``Hostname``, DCGM <= 4.5 names, GPU_UTIL in %),
4.8.3+ (``hostname``), 4.9+ (DCGM 4.6+ names, GPU_UTIL as a ratio) and a 4.9+ GPU scraped twice,
once under each family (a double scrape must stay one series). Every GPU plays the same readings,
so every query must give each GPU the same value, whatever its generation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation
from tests.e2e.harness import built_tool
from tests.e2e.test_chart import ALL_ON, helm_bin, one, render, run  # noqa: F401

pytestmark = pytest.mark.e2e

#: One reading per signal, in the DCGM <= 4.5 unit; each GPU serves it in its generation's.
READINGS: Final = {
    "SM_ACTIVE": 0.42,
    "GR_ENGINE_ACTIVE": 0.5,
    "GPU_UTIL": 90.0,
    "GPU_TEMP": 71.0,
    "POWER": 350.0,
    "XID": 79.0,
}
#: gpu index -> (generation, also serve the other family under the same labels: a double scrape).
GPUS: Final = {
    "0": (Generation.LEGACY, False),
    "1": (Generation.V4, False),
    "2": (Generation.V4_8_3, False),
    "3": (Generation.V4_9, False),
    "4": (Generation.V4_9, True),
}
NODE: Final = "gpu-node-0"


def input_series() -> list[dict[str, str]]:
    series = []
    for gpu, (generation, both) in GPUS.items():
        spec = ef.GENERATIONS[generation]
        labels = f'gpu="{gpu}",UUID="GPU-{gpu}",{spec.node_label}="{NODE}",job="nvidia-dcgm-exporter"'
        for signal, value in READINGS.items():
            names = {spec.name(signal)} | ({ef.FIELDS_BY_SIGNAL[signal].legacy} if both else set())
            for name in names:
                served = value / 100 if name == "DCGM_FI_DEV_GPU_UTIL_RATIO" else value
                series.append({"series": f"{name}{{{labels}}}", "values": f"{served:g}x10"})
    return series


def promtool_tests(tmp_path: Path, rules: list[dict[str, Any]], cases: list[dict[str, Any]]) -> str:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": input_series(), "promql_expr_test": cases}],
    }
    path = tmp_path / "generations.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    out = run(built_tool("promtool", "PROMTOOL"), "test", "rules", str(path), expect_failure=False)
    return out.stdout + out.stderr


def dashboard_dcgm_exprs(docs: list[dict[str, Any]]) -> dict[str, str]:
    dashboard = json.loads(one(docs, "ConfigMap", "-dashboard")["data"]["gpu-efficiency.json"])
    return {
        p["title"]: t["expr"]
        for p in dashboard["panels"]
        for t in p.get("targets", [])
        if "DCGM_" in t["expr"]
    }


EXPECTED_PANELS: Final = {
    "GPU activity (SM active, else graphics engine)": READINGS["SM_ACTIVE"],
    "GPU utilization (nvidia-smi's)": READINGS["GPU_UTIL"] / 100,
    "GPU temperature": READINGS["GPU_TEMP"],
}


def test_dashboard_panels_give_every_generation_the_same_value_once_per_gpu(
    helm_bin: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    exprs = dashboard_dcgm_exprs(render(helm_bin, *ALL_ON, api_versions=True))
    assert set(exprs) == set(EXPECTED_PANELS)
    cases = []
    for title, expr in exprs.items():
        samples = []
        for gpu, (generation, _) in GPUS.items():
            label = ef.GENERATIONS[generation].node_label
            samples.append({"labels": f'{{gpu="{gpu}",{label}="{NODE}"}}', "value": EXPECTED_PANELS[title]})
        cases.append({"expr": expr, "eval_time": "1m", "exp_samples": samples})
    out = promtool_tests(tmp_path, [], cases)
    assert "SUCCESS" in out, out


def test_recording_rules_name_every_generation_alike(helm_bin: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm_bin, *ALL_ON, "prometheusRule.dcgmRecordingRules.enabled=true", api_versions=True)
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    expected = {
        "gpuefficiency:dcgm_sm_active:ratio": READINGS["SM_ACTIVE"],
        "gpuefficiency:dcgm_gr_engine_active:ratio": READINGS["GR_ENGINE_ACTIVE"],
        "gpuefficiency:dcgm_gpu_util:ratio": READINGS["GPU_UTIL"] / 100,
        "gpuefficiency:dcgm_gpu_temp:celsius": READINGS["GPU_TEMP"],
        "gpuefficiency:dcgm_power_usage:watts": READINGS["POWER"],
        "gpuefficiency:dcgm_xid_errors:last": READINGS["XID"],
    }
    assert recorded == set(expected)
    cases = [
        {
            "expr": record,
            "eval_time": "1m",
            "exp_samples": [
                {
                    "labels": f'{record}{{gpu="{gpu}",UUID="GPU-{gpu}",hostname="{NODE}",job="nvidia-dcgm-exporter"}}',
                    "value": value,
                }
                for gpu in GPUS
            ],
        }
        for record, value in expected.items()
    ]
    out = promtool_tests(tmp_path, groups, cases)
    assert "SUCCESS" in out, out
    # off by default: the alert rules alone, as before
    default = one(render(helm_bin, *ALL_ON, api_versions=True), "PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in default] == ["gpu-efficiency-operator"]
