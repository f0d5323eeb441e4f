"""Prometheus and agents together: either alone suffices; both down is blind; the better sample wins."""

from dataclasses import replace

import pytest

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.trust import DropReason
from gpu_efficiency.sources.metrics.base import FetchRequest, SourceUnavailable, StaticSource
from gpu_efficiency.sources.metrics.combined import CombinedSource

NOW = 1_700_000_000.0
REQUEST = FetchRequest(now=NOW, windows={Window.ACTIVITY: 60.0}, scrape_interval=1.0)


def sample(uuid: str, signal: Signal, source: str) -> GPUSample:
    stats = Stats(avg=0.5, max=0.6, min=0.4, last=0.5, count=60, last_timestamp=NOW - 1)
    return GPUSample(
        node="n",
        uuid=uuid,
        index="0",
        model="H100",
        pods=(),
        stats={Window.ACTIVITY: {signal: stats}},
        source=source,
        expected_samples={Window.ACTIVITY: 60.0},
    )


def test_agent_sample_with_sm_active_beats_prometheus_gr_engine() -> None:
    prom = StaticSource(
        [
            sample("GPU-1", Signal.GR_ENGINE_ACTIVE, "prometheus"),
            sample("GPU-2", Signal.SM_ACTIVE, "prometheus"),
        ]
    )
    agents = StaticSource([sample("GPU-1", Signal.SM_ACTIVE, "agent")])
    result = CombinedSource(prom, agents, max_staleness=120).fetch(REQUEST)
    assert {g.uuid: g.source for g in result.gpus} == {"GPU-1": "agent", "GPU-2": "prometheus"}


@pytest.mark.parametrize("down", ["prometheus", "agents"])
def test_either_source_alone_suffices(down: str) -> None:
    prom = StaticSource(
        [sample("GPU-1", Signal.SM_ACTIVE, "prometheus")], error="refused" if down == "prometheus" else None
    )
    agents = StaticSource(
        [sample("GPU-2", Signal.SM_ACTIVE, "agent")], error="refused" if down == "agents" else None
    )
    result = CombinedSource(prom, agents, max_staleness=120).fetch(REQUEST)
    assert [g.uuid for g in result.gpus] == (["GPU-2"] if down == "prometheus" else ["GPU-1"])
    assert any("refused" in w for w in result.warnings)


def test_both_down_is_unavailable() -> None:
    with pytest.raises(SourceUnavailable, match="Prometheus: down; node agents: gone"):
        CombinedSource(StaticSource(error="down"), StaticSource(error="gone"), max_staleness=120).fetch(
            REQUEST
        )


def test_a_prometheus_series_placing_an_agents_gpu_on_another_node_never_wins() -> None:
    """Prometheus' sample has the better signal (SM active) but names node "forged"; the agent
    reads the GPU on node "n" through NVML: the agent's sample is kept and the other counted."""
    forged = replace(sample("GPU-1", Signal.SM_ACTIVE, "prometheus"), node="forged")
    agents = StaticSource([sample("GPU-1", Signal.GPU_UTIL, "agent")])
    result = CombinedSource(StaticSource([forged]), agents, max_staleness=120).fetch(REQUEST)
    assert [(g.uuid, g.node, g.source) for g in result.gpus] == [("GPU-1", "n", "agent")]
    assert result.dropped == {DropReason.NODE_CONFLICT: 1}


def _with(uuid: str, source: str, **signals: float) -> GPUSample:
    base = sample(uuid, Signal.SM_ACTIVE, source)
    window = {
        Signal[name]: Stats(avg=v, max=v, min=v, last=v, count=60, last_timestamp=NOW - 1)
        for name, v in signals.items()
    }
    return replace(base, stats={Window.ACTIVITY: window})


def test_a_forged_idle_prometheus_reading_loses_to_the_agents_busy_one() -> None:
    """Prometheus' SM_ACTIVE 0 (forged) would win on signal rank over the agent's GPU_UTIL 99 %."""
    forged = _with("GPU-1", "prometheus", SM_ACTIVE=0.0)
    agents = StaticSource([_with("GPU-1", "agent", GPU_UTIL=99.0)])
    result = CombinedSource(StaticSource([forged]), agents, max_staleness=120).fetch(REQUEST)
    assert [g.source for g in result.gpus] == ["agent"]
    assert result.dropped == {DropReason.CONTRADICTS_AGENT: 1}


def test_agreeing_sources_keep_the_better_signal() -> None:
    """An idle GPU by both, and a fake load (SM 0.05 of a 100 % GPU_UTIL): no contradiction."""
    for prom, agent in (
        (_with("GPU-1", "prometheus", SM_ACTIVE=0.0), _with("GPU-1", "agent", GPU_UTIL=0.0)),
        (_with("GPU-1", "prometheus", SM_ACTIVE=0.05), _with("GPU-1", "agent", GPU_UTIL=100.0)),
    ):
        result = CombinedSource(StaticSource([prom]), StaticSource([agent]), max_staleness=120).fetch(REQUEST)
        assert [g.source for g in result.gpus] == ["prometheus"]
        assert result.dropped == {}
