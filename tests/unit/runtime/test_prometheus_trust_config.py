"""--prometheus-matchers defaults to the exporters' scrape jobs and --prometheus-max-series caps an
answer; both reach the running operator's Prometheus source (issue 19, finding 1c/1d)."""

from __future__ import annotations

import argparse

import pytest
from kubernetes import client

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.config import (
    DEFAULT_MATCHERS,
    DEFAULT_MAX_SERIES,
    add_setting_arguments,
    config_from_args,
)
from gpu_efficiency.runtime.deps import SourceCache
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource


def _config(argv: list[str]) -> PrometheusConfig:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    config = config_from_args(parser.parse_args([*argv, "--agent-urls=http://agent:1"]))
    source = SourceCache(config, client.ApiClient())("p", GPUEfficiencyPolicySpec())
    assert isinstance(source, PrometheusSource)
    return source.config


def test_defaults_select_the_exporters_jobs_and_cap_answers() -> None:
    config = _config([])
    assert config.matchers == DEFAULT_MATCHERS
    assert config.matchers.startswith('job=~"')
    assert config.max_series == DEFAULT_MAX_SERIES


def test_flags_and_environment_override(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config(['--prometheus-matchers=job="dcgm"']).matchers == 'job="dcgm"'
    assert _config(["--prometheus-matchers="]).matchers == ""  # explicitly: every job
    monkeypatch.setenv("GPUEFF_PROMETHEUS_MATCHERS", 'namespace="gpu-operator"')
    assert _config([]).matchers == 'namespace="gpu-operator"'
    assert _config(["--prometheus-max-series=10"]).max_series == 10
