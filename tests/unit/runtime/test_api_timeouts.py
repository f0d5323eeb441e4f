"""Every Kubernetes API call has a timeout: a server that accepts and never answers must not hold a
call (and with it the one scheduler thread that runs every policy) forever."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from tests.unit.sources.metrics.slow_http import slow_server

from gpu_efficiency.apiclient import TimeoutApiClient, load_api_client
from gpu_efficiency.config import add_setting_arguments, config_from_args


def _kubeconfig(tmp_path: Path, url: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _ends_within(seconds: float, call: Callable[[], object]) -> tuple[bool, BaseException | None]:
    """Run ``call`` in a thread; did it end (by answer or error) within ``seconds``?"""
    error: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), (error[0] if error else None)


def test_the_operator_client_times_out_on_a_silent_api_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slow_server(gap=None) as url:
        path = str(_kubeconfig(tmp_path, url))
        monkeypatch.setattr(kube_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        api = load_api_client(timeout=0.5)
        calls: dict[str, Callable[[], object]] = {
            "pods": lambda: client.CoreV1Api(api).list_namespaced_pod("default"),
            "node": lambda: client.CoreV1Api(api).patch_node("n", {}),
            "event": lambda: client.CoreV1Api(api).create_namespaced_event("default", {}),
            "status": lambda: client.CustomObjectsApi(api).patch_cluster_custom_object_status(
                "gpuefficiency.io", "v1alpha1", "gpuefficiencypolicies", "p", {}
            ),
            "lease": lambda: client.CoordinationV1Api(api).read_namespaced_lease("l", "ns"),
        }
        for name, call in calls.items():
            ended, error = _ends_within(5.0, call)
            assert ended, f"{name}: still waiting after 5 s"  # the default would wait 60 s and more
            assert error is not None, name


def test_a_call_that_sets_its_own_timeout_keeps_it(tmp_path: Path) -> None:
    with slow_server(gap=None) as url:
        configuration = client.Configuration(host=url)
        api = TimeoutApiClient(configuration, timeout=60.0)
        started = time.monotonic()
        ended, error = _ends_within(5.0, lambda: client.CoreV1Api(api).list_node(_request_timeout=(0.3, 0.3)))
        assert ended
        assert error is not None
        assert time.monotonic() - started < 3.0


def test_the_timeout_is_an_operator_setting() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_setting_arguments(parser, "run")
    assert config_from_args(parser.parse_args(["--api-timeout", "7"])).api_timeout == 7.0
    assert config_from_args(parser.parse_args([])).api_timeout == 30.0
    with pytest.raises(ValueError, match="positive"):
        TimeoutApiClient(client.Configuration(), timeout=0)
