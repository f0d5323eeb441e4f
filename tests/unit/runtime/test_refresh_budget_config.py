"""--prometheus-refresh-budget reaches the Prometheus source of the running operator (default 0: off)."""

from __future__ import annotations

import argparse

import pytest
from kubernetes import client

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.config import add_setting_arguments, config_from_args
from gpu_efficiency.runtime.deps import SourceCache
from gpu_efficiency.sources.metrics.prometheus import PrometheusSource


def _budget(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    config = config_from_args(parser.parse_args([*argv, "--agent-urls=http://agent:1"]))
    source = SourceCache(config, client.ApiClient())("p", GPUEfficiencyPolicySpec())
    assert isinstance(source, PrometheusSource)
    return source.refresh_budget


def test_default_is_off() -> None:
    assert _budget([]) == 0


def test_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _budget(["--prometheus-refresh-budget=500"]) == 500
    monkeypatch.setenv("GPUEFF_PROMETHEUS_REFRESH_BUDGET", "250")
    assert _budget([]) == 250
    assert _budget(["--prometheus-refresh-budget=-3"]) == 0
