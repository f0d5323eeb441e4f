"""The policy sources cache keeps one Prometheus source per URL in use, and drops the others."""

from __future__ import annotations

from kubernetes import client

from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.runtime.deps import build_runner

CONFIG = OperatorConfig(
    prometheus_url="http://default:9090", leader_election=False, agent_urls=("http://agent:9400",)
)


def _spec(url: str = "") -> GPUEfficiencyPolicySpec:
    return GPUEfficiencyPolicySpec.model_validate({"metrics": {"prometheus": {"url": url}}})


def test_sources_no_policy_uses_are_dropped() -> None:
    runner = build_runner(CONFIG, client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    cache = runner.source_for
    cache("a", _spec("http://one:9090"))
    cache("b", _spec("http://two:9090"))
    cache("c", _spec())
    cache("d", _spec())
    urls = [url for url, _ in cache.cached()]  # type: ignore[attr-defined]
    assert urls == ["http://default:9090", "http://one:9090", "http://two:9090"]
    cache("a", _spec("http://three:9090"))  # edited to another URL: one is used by nobody now
    runner.forget("b")  # deleted
    runner.forget("c")  # default still used by d
    urls = [url for url, _ in cache.cached()]  # type: ignore[attr-defined]
    assert urls == ["http://default:9090", "http://three:9090"]
    runner.forget("a")
    runner.forget("d")
    assert cache.cached() == []  # type: ignore[attr-defined]


def test_a_policy_keeps_its_source_across_cycles() -> None:
    runner = build_runner(CONFIG, client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    first = runner.source_for("a", _spec("http://one:9090"))
    assert runner.source_for("a", _spec("http://one:9090")) is first
