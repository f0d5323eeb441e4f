"""Node-agent source against real agents in-process (fake NVML, real HTTP), dead agents, and merging."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_efficiency.agent.auth import Gate, UserInfo
from gpu_efficiency.agent.nvml.types import EventKind
from gpu_efficiency.agent.pods import Attributor, parse_static
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import AgentServer
from gpu_efficiency.engine.model import GPUSample, PodRef, Signal, Stats, Window
from gpu_efficiency.engine.trust import merge_samples
from gpu_efficiency.sources.metrics.agent import (
    AGENT_POD_SELECTOR,
    AgentEndpoint,
    AgentSource,
    endpoints_from_pods,
    pod_endpoints,
    samples_from_snapshot,
)
from gpu_efficiency.sources.metrics.base import FetchRequest, SourceUnavailable
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend, FakeGpu
from gpu_efficiency_sim.fake_nvml.scenario import profile_values

WINDOWS = {Window.ACTIVITY: 60.0, Window.FAULT: 10.0}


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


class _Node:
    def __init__(self, name: str, gpus: list[FakeGpu], pods: str = "") -> None:
        self.backend = FakeBackend(gpus)
        attributor = Attributor(self.backend, static=parse_static(pods))
        self.agent = Agent(
            self.backend,
            AgentConfig(node_name=name, interval_s=0.05, event_poll_s=0.05, history_s=30),
            attributor,
        )
        self.server = AgentServer(self.agent, "127.0.0.1:0")
        self.url = f"http://127.0.0.1:{self.server.port}"
        self.server.start()
        self.agent.start()
        _wait(lambda: self.agent.readiness()[0] and len(self.agent.views()) >= len(gpus))
        time.sleep(0.15)  # a few samples, GPM included

    def stop(self) -> None:
        self.agent.stop()
        self.server.stop()


def _busy(index: int, uuid: str) -> FakeGpu:
    g = FakeGpu(index=index, uuid=uuid)
    for name, value in profile_values("compute-bound").items():
        setattr(g, name, value)
    return g


@pytest.fixture
def nodes() -> Iterator[tuple[_Node, _Node]]:
    a = _Node("node-a", [_busy(0, "GPU-a0"), FakeGpu(index=1, uuid="GPU-a1")], pods="ml/train/worker=GPU-a0")
    mig_parent = FakeGpu(index=0, uuid="GPU-b0")
    mig_parent.mig = [
        FakeGpu(index=0, uuid="MIG-b", parent_uuid="GPU-b0", gpu_instance_id=5, mig_profile="1g.10gb")
    ]
    b = _Node("node-b", [mig_parent], pods="web/infer=MIG-b")
    yield a, b
    a.stop()
    b.stop()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when we return: connection refused


def test_samples_from_live_agents(nodes: tuple[_Node, _Node]) -> None:
    a, b = nodes
    source = AgentSource([a.url, b.url])
    now = time.time()
    result = source.fetch(FetchRequest(now=now, windows=WINDOWS, scrape_interval=15.0))
    assert result.warnings == ()
    assert result.queries == 2
    by_uuid = {g.uuid: g for g in result.gpus}
    assert set(by_uuid) == {"GPU-a0", "GPU-a1", "GPU-b0", "GPU-b0/5"}  # MIG keyed like the Prometheus source
    busy = by_uuid["GPU-a0"]
    assert (busy.node, busy.index, busy.model, busy.source) == (
        "node-a",
        "0",
        "NVIDIA H100 80GB HBM3",
        "agent",
    )
    assert busy.pods == (PodRef("ml", "train", "worker"),)
    assert busy.expected_samples == {
        Window.ACTIVITY: pytest.approx(1200.0),
        Window.FAULT: pytest.approx(200.0),
    }
    assert busy.fb_total_mib == 81559.0
    sm = busy.get(Window.ACTIVITY, Signal.SM_ACTIVE)
    assert sm is not None
    assert sm.max == pytest.approx(profile_values("compute-bound")["gpm"].sm_util / 100)
    assert sm.count >= 2
    assert now - 2 < sm.last_timestamp <= time.time() + 0.5
    gpu_util = busy.get(Window.ACTIVITY, Signal.GPU_UTIL)
    assert gpu_util is not None
    assert gpu_util.avg == pytest.approx(profile_values("compute-bound")["gpu_util"])
    xid = busy.get(Window.FAULT, Signal.XID)
    assert xid is not None
    assert (xid.last, xid.changes) == (0.0, 0)
    idle = by_uuid["GPU-a1"].get(Window.ACTIVITY, Signal.SM_ACTIVE)
    assert idle is not None
    assert idle.max == 0.0  # measured zero, not missing
    mig = by_uuid["GPU-b0/5"]
    assert (mig.node, mig.index, mig.pods) == ("node-b", "0", (PodRef("web", "infer"),))
    source.close()


def test_xid_event_appears_as_a_change_in_the_fault_window(nodes: tuple[_Node, _Node]) -> None:
    a, _ = nodes
    a.backend.inject("GPU-a1", EventKind.XID, 79)
    _wait(lambda: a.agent.faults.get("GPU-a1").last_xid == 79)
    time.sleep(0.1)
    (gpu,) = [
        g
        for g in AgentSource([a.url]).fetch(FetchRequest(time.time(), WINDOWS, 15.0)).gpus
        if g.uuid == "GPU-a1"
    ]
    xid = gpu.get(Window.FAULT, Signal.XID)
    assert xid is not None
    assert (xid.last, xid.changes, xid.first) == (79.0, 1, 0.0)


def test_dead_agent_yields_no_samples_for_its_node(nodes: tuple[_Node, _Node]) -> None:
    a, _ = nodes
    dead = _dead_url()
    source = AgentSource(
        lambda: [AgentEndpoint(a.url, "node-a"), AgentEndpoint(dead, "node-dead")], timeout_s=1.0
    )
    result = source.fetch(FetchRequest(time.time(), WINDOWS, 15.0))
    assert {g.node for g in result.gpus} == {"node-a"}
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("agent node-dead: ConnectError")


def test_no_agent_answering_is_source_unavailable() -> None:
    source = AgentSource([_dead_url(), _dead_url()], timeout_s=1.0)
    with pytest.raises(SourceUnavailable, match="no node agent answered"):
        source.fetch(FetchRequest(time.time(), WINDOWS, 15.0))
    assert source.fetch_samples(None, 60.0, time.time()) == []


def test_discovery_failure_is_source_unavailable() -> None:
    def broken() -> list[AgentEndpoint]:
        raise RuntimeError("apiserver down")

    with pytest.raises(SourceUnavailable, match="apiserver down"):
        AgentSource(broken).fetch(FetchRequest(time.time(), WINDOWS, 15.0))


def test_node_filter_skips_other_agents_before_asking(nodes: tuple[_Node, _Node]) -> None:
    a, b = nodes
    endpoints = [AgentEndpoint(a.url, "node-a"), AgentEndpoint(b.url, "node-b")]
    result = AgentSource(lambda: endpoints).fetch(FetchRequest(time.time(), WINDOWS, 15.0), nodes=["node-b"])
    assert result.queries == 1
    assert {g.node for g in result.gpus} == {"node-b"}
    samples = AgentSource([a.url, b.url]).fetch_samples(["node-a"], 30.0, time.time())
    assert {g.node for g in samples} == {"node-a"}


def test_agent_answering_for_another_node_is_refused(nodes: tuple[_Node, _Node]) -> None:
    a, b = nodes
    result = AgentSource(lambda: [AgentEndpoint(a.url, "node-b"), AgentEndpoint(b.url, "node-b")]).fetch(
        FetchRequest(time.time(), WINDOWS, 15.0)
    )
    assert {g.node for g in result.gpus} == {"node-b"}
    assert "answers for node 'node-a'" in result.warnings[0]


def test_endpoints_from_agent_pods() -> None:
    def pod(name: str, ip: str | None, phase: str = "Running", ready: str = "True") -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {"nodeName": f"node-{name}"},
            "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
        }

    pods = [pod("a", "10.0.0.1"), pod("b", None), pod("c", "10.0.0.3", "Pending"), pod("d", "fd00::4")]
    pods.append(pod("e", "10.0.0.5", ready="False"))
    assert endpoints_from_pods(pods) == [
        AgentEndpoint("http://10.0.0.1:9400", "node-a"),
        AgentEndpoint("http://[fd00::4]:9400", "node-d"),
    ]
    calls: list[tuple[str, str]] = []
    discover = pod_endpoints(lambda ns, sel: calls.append((ns, sel)) or pods[:1], "gpu-efficiency", port=9500)
    assert discover() == [AgentEndpoint("http://10.0.0.1:9500", "node-a")]
    assert calls == [("gpu-efficiency", AGENT_POD_SELECTOR)]


def _snapshot(pods: list[dict[str, str]]) -> dict[str, Any]:
    stat = {"avg": 1, "max": 1, "min": 1, "last": 1, "count": 3, "last_timestamp": 100.0, "first": 1}
    return {
        "schema": "gpuefficiency.io/agent-snapshot/v1",
        "node": "n",
        "interval_seconds": 2.0,
        "timestamp": 100.0,
        "gpus": [
            {
                "index": "0",
                "uuid": "GPU-x",
                "name": "H100",
                "mig": None,
                "fields": {},
                "pods": pods,
                "stats": {"activity": {"DCGM_FI_DEV_GPU_UTIL": stat, "NOT_A_SIGNAL": stat}, "bogus": {}},
            }
        ],
    }


def test_snapshot_conversion_offsets_clocks_and_resolves_uids() -> None:
    pods = [{"namespace": "", "name": "", "uid": "u-1"}, {"namespace": "", "name": "", "uid": "u-2"}]
    resolver = {"u-1": PodRef("ml", "found")}.get
    (gpu,) = samples_from_snapshot(
        _snapshot(pods), {Window.ACTIVITY: 60.0}, offset=-5.0, uid_resolver=resolver
    )
    assert gpu.pods == (PodRef("ml", "found"),)  # u-2 unknown: dropped, never invented
    assert gpu.expected_samples == {Window.ACTIVITY: 30.0}
    assert set(gpu.stats) == {Window.ACTIVITY}
    util = gpu.get(Window.ACTIVITY, Signal.GPU_UTIL)
    assert util is not None
    assert util.last_timestamp == 95.0
    with pytest.raises(SourceUnavailable, match="not an agent snapshot"):
        samples_from_snapshot({"schema": "x"}, {})


def _sample(source: str, *, signal: Signal, count: int, last: float, expected: float = 40.0) -> GPUSample:
    stats = Stats(avg=0.5, max=0.5, min=0.5, last=0.5, count=count, last_timestamp=last)
    return GPUSample(
        node="n",
        uuid="GPU-1",
        index="0",
        model="H100",
        pods=(),
        stats={Window.ACTIVITY: {signal: stats}},
        source=source,
        expected_samples={Window.ACTIVITY: expected},
    )


SM, UTIL = Signal.SM_ACTIVE, Signal.GPU_UTIL


@pytest.mark.parametrize(
    ("prom", "agent", "winner"),
    [
        # the better activity signal wins: SM active from dcgm beats GPU util from an old GPU's agent
        ((SM, 40, 995), (UTIL, 600, 999), "prometheus"),
        # fresh beats stale, whatever the signal
        ((SM, 40, 500), (UTIL, 600, 999), "agent"),
        # same signal, better coverage wins (an agent restarted a minute ago)
        ((SM, 40, 995), (SM, 60, 999), "prometheus"),
        # same signal and coverage: the fresher one, the agent
        ((SM, 40, 990), (SM, 600, 999), "agent"),
    ],
)
def test_merge_prefers_fresh_then_better_signal_then_coverage(
    prom: tuple[Signal, int, float], agent: tuple[Signal, int, float], winner: str
) -> None:
    p = _sample("prometheus", signal=prom[0], count=prom[1], last=prom[2])
    a = _sample("agent", signal=agent[0], count=agent[1], last=agent[2], expected=600.0)
    other = GPUSample("n", "GPU-2", "1", "H100", (), {}, "prometheus")
    merged = merge_samples([p, other], [a], now=1000.0, max_staleness=120.0)
    assert [g.uuid for g in merged] == ["GPU-1", "GPU-2"]
    assert merged[0].source == winner


class _TokenReviewer:
    """Accepts one token, for the operator, allowed to get /snapshot."""

    def __init__(self, token: str) -> None:
        self.token = token

    def authenticate(self, token: str) -> UserInfo | None:
        return UserInfo("system:serviceaccount:gpu-eff:operator") if token == self.token else None

    def authorize(self, user: UserInfo, path: str, verb: str) -> bool:
        return path == "/snapshot" and verb == "get"


def test_the_source_sends_its_token_to_agents_that_require_one(tmp_path: Any) -> None:
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-t0")])
    agent = Agent(backend, AgentConfig(node_name="node-t", interval_s=0.05, history_s=30))
    reviewer = _TokenReviewer("first")
    server = AgentServer(agent, "127.0.0.1:0", gate=Gate(reviewer, ttl_s=0))
    server.start()
    agent.start()
    url = f"http://127.0.0.1:{server.port}"
    token = tmp_path / "token"
    request = FetchRequest(now=time.time(), windows=WINDOWS, scrape_interval=0.0)
    try:
        _wait(lambda: agent.readiness()[0])
        with pytest.raises(SourceUnavailable, match="HTTP 401"):
            AgentSource([url]).fetch(request)
        token.write_text("first\n")
        source = AgentSource([url], token_file=str(token))
        assert [g.uuid for g in source.fetch(request).gpus] == ["GPU-t0"]
        reviewer.token = "rotated"  # the kubelet rotated the projected token: the file is read again
        token.write_text("rotated")
        assert [g.uuid for g in source.fetch(request).gpus] == ["GPU-t0"]
        token.unlink()
        with pytest.raises(SourceUnavailable, match="token file"):
            source.fetch(request)
    finally:
        agent.stop()
        server.stop()


def _with_fault(sample: GPUSample, **signals: tuple[float, int, float]) -> GPUSample:
    """``sample`` with fault-window stats: signal name -> (last value, changes, newest sample time)."""
    fault = {
        Signal[name]: Stats(avg=v, max=v, min=0.0, last=v, count=120, last_timestamp=t, changes=c)
        for name, (v, c, t) in signals.items()
    }
    return dataclasses.replace(sample, stats={**sample.stats, Window.FAULT: fault})


@pytest.mark.parametrize(
    ("prom_fault", "agent_fault", "winner"),
    [
        # Prometheus has not scraped the XID the agent's event already put in its window: the agent
        ({"XID": (0, 0, 995.0)}, {"XID": (79, 1, 999.0)}, "agent"),
        # nor the double-bit error
        ({"ECC_DBE_VOLATILE": (0, 0, 995.0)}, {"ECC_DBE_VOLATILE": (1, 1, 999.0)}, "agent"),
        # Prometheus fetched no fault window for this GPU (its hints): the agent's news wins
        ({}, {"XID": (79, 1, 999.0)}, "agent"),
        # Prometheus already holds the same value: no news, the usual rules (its SM active wins)
        ({"XID": (79, 1, 998.0)}, {"XID": (79, 1, 999.0)}, "prometheus"),
        # a Prometheus sample newer than the agent's with another value contradicts it: usual rules
        ({"XID": (0, 0, 999.5)}, {"XID": (79, 1, 999.0)}, "prometheus"),
        # no change in the agent's window: an old XID is no news
        ({"XID": (0, 0, 995.0)}, {"XID": (79, 0, 999.0)}, "prometheus"),
        # a stale agent window is no news either
        ({"XID": (0, 0, 500.0)}, {"XID": (79, 1, 800.0)}, "prometheus"),
    ],
)
def test_merge_takes_the_agents_sample_when_it_holds_a_fault_prometheus_has_not_scraped(
    prom_fault: dict[str, tuple[float, int, float]],
    agent_fault: dict[str, tuple[float, int, float]],
    winner: str,
) -> None:
    p = _with_fault(_sample("prometheus", signal=SM, count=40, last=995), **prom_fault)
    a = _with_fault(_sample("agent", signal=UTIL, count=600, last=999, expected=600.0), **agent_fault)
    (merged,) = merge_samples([p], [a], now=1000.0, max_staleness=120.0)
    assert merged.source == winner
