"""``--exporter-names``: /metrics serves one dcgm-exporter generation's names, units and node label; the
JSON snapshot keeps the agent's own keys and units whatever the choice."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.agent.cli import build_agent
from gpu_efficiency.agent.naming import AGENT_GENERATIONS, DEFAULT_NAMES, naming
from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency_sim.fake_nvml.backend import IDLE_GPM, FakeBackend, FakeGpu
from gpu_efficiency_sim.fake_nvml.command import add_fake_agent_command, fake_backend


def busy_gpu() -> FakeBackend:
    gpu = FakeGpu(
        index=0, uuid="GPU-aaa", gpu_util=90.0, gpm=replace(IDLE_GPM, sm_util=45.0, graphics_util=90.0)
    )
    return FakeBackend([gpu])


def scrape(
    serve: Callable[..., Any], http: httpx.Client, wait_until: Callable[..., Any], **config: Any
) -> tuple[dict[str, list[tuple[dict[str, str], float]]], dict[str, Any]]:
    """(/metrics by family, /snapshot's first GPU) once GPM's second sample is in."""
    _, url = serve(busy_gpu(), **config)
    wait_until(lambda: "DCGM_FI_PROF_SM_" in http.get(f"{url}/metrics").text)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(http.get(f"{url}/metrics").text):
        out[family.name] = [(s.labels, s.value) for s in family.samples]
    return out, http.get(f"{url}/snapshot?history=60").json()["gpus"][0]


def test_the_default_is_dcgm_exporter_4_8_3s_names_with_the_hostname_label(
    serve: Callable[..., Any], http: httpx.Client, wait_until: Callable[..., Any]
) -> None:
    assert DEFAULT_NAMES is Generation.V4_8_3
    metrics, _ = scrape(serve, http, wait_until)
    labels, value = metrics["DCGM_FI_DEV_GPU_UTIL"][0]
    assert labels["hostname"] == "node-a"
    assert "Hostname" not in labels
    assert value == 90.0
    assert metrics["DCGM_FI_PROF_SM_ACTIVE"][0][1] == pytest.approx(0.45)


def test_4_9_serves_dcgm_4_6_names_and_units_while_the_snapshot_stays_the_same(
    serve: Callable[..., Any], http: httpx.Client, wait_until: Callable[..., Any]
) -> None:
    new, new_snapshot = scrape(serve, http, wait_until, exporter_names=Generation.V4_9)
    old, old_snapshot = scrape(serve, http, wait_until, exporter_names=Generation.V4)
    for spec in ef.FIELDS:
        if spec.renamed and spec.legacy in old:
            assert spec.current in new, spec.current
            assert spec.legacy not in new, spec.legacy
    assert new["DCGM_FI_DEV_GPU_UTIL_RATIO"][0][1] == pytest.approx(0.9)  # 90 % as a ratio
    assert new["DCGM_FI_PROF_SM_UTIL_RATIO"][0][1] == pytest.approx(0.45)
    assert new["DCGM_FI_DEV_FB_TOTAL"][0][1] == old["DCGM_FI_DEV_FB_TOTAL"][0][1] * 1024 * 1024
    assert new["DCGM_FI_DEV_SM_CLOCK"][0][1] == old["DCGM_FI_DEV_SM_CLOCK"][0][1] * 1e6
    assert "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS" in new
    assert new["DCGM_FI_DEV_GPU_UTIL_RATIO"][0][0]["hostname"] == "node-a"
    assert old["DCGM_FI_DEV_GPU_UTIL"][0][0]["Hostname"] == "node-a"
    # the operator's JSON snapshot: same keys and units whatever /metrics serves
    assert set(new_snapshot["fields"]) == set(old_snapshot["fields"])
    assert new_snapshot["fields"]["gpu_util"] == old_snapshot["fields"]["gpu_util"] == 90.0
    assert new_snapshot["fields"]["fb_total_mib"] == old_snapshot["fields"]["fb_total_mib"]
    assert set(new_snapshot["history"]["signals"]) == set(old_snapshot["history"]["signals"])


def test_legacy_serves_the_clock_throttle_name(
    serve: Callable[..., Any], http: httpx.Client, wait_until: Callable[..., Any]
) -> None:
    metrics, _ = scrape(serve, http, wait_until, exporter_names=Generation.LEGACY)
    assert ef.OLD_CLOCK_EVENTS in metrics
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in metrics


def test_every_generation_renames_each_field_to_a_distinct_name() -> None:
    for gen in AGENT_GENERATIONS:
        names = naming(gen)
        served = [names.name(f.legacy) for f in ef.FIELDS]
        assert len(set(served)) == len(served), gen


@pytest.mark.parametrize("bad", ["default-csv", "unknown", "4.9"])
def test_an_unknown_generation_is_refused_with_the_accepted_ones(bad: str) -> None:
    with pytest.raises(ValueError, match=r"use one of legacy, 4.x, 4.8.3\+, 4.9\+"):
        naming(bad)


def test_the_flag_reaches_the_agent_and_a_bad_value_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    add_fake_agent_command(parser.add_subparsers())
    args = parser.parse_args(["agent", "--fake-gpus", "1", "--exporter-names", "4.9+"])
    assert build_agent(args, backend_factory=fake_backend).config.exporter_names is Generation.V4_9
    default = parser.parse_args(["agent", "--fake-gpus", "1"])
    assert build_agent(default, backend_factory=fake_backend).config.exporter_names is DEFAULT_NAMES
    with pytest.raises(SystemExit):
        parser.parse_args(["agent", "--fake-gpus", "1", "--exporter-names", "4.10"])
    assert "invalid choice: '4.10'" in capsys.readouterr().err
