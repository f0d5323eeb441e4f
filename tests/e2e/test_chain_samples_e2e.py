"""The activity chain, and a restart's whole activity window, read as raw samples
(``tiered/chain_samples.py``) against the real Prometheus: the rows the source makes of them must be
the rows Prometheus' own aggregates give (``max_over_time``, ``avg_over_time``, ``min_over_time``,
``last_over_time``, ``count_over_time``, ``stddev_over_time``, ``timestamp``, by ``UUID, GPU_I_ID``),
the whole window's to the last bit, for the simulator's GPUs as they are scraped now: two busy under
pods (noisy values: a spread to compare), six free."""

from __future__ import annotations

import math
import time

import pytest
from kubernetes import client

from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.aggregate_rows import FIELDS
from gpu_efficiency.sources.metrics.prometheus.promql import Query, listed_window_queries
from gpu_efficiency.sources.metrics.prometheus.regex_lists import uuid_alternatives
from gpu_efficiency.sources.metrics.prometheus.tiered.chain_samples import (
    CHAIN_PLAN,
    WHOLE_PLAN,
    chain_sample_queries,
    whole_sample_queries,
)
from gpu_efficiency.sources.metrics.prometheus.windows import WindowValues
from tests.e2e.harness import wait_for
from tests.e2e.sim_fixtures import GPUNodes, RunningSimulator, gpu_nodes, simulator
from tests.e2e.test_simulator import deployment

__all__ = ["gpu_nodes", "simulator"]  # fixtures used below

pytestmark = pytest.mark.e2e

WINDOW_S = 20.0


def _rows(source: PrometheusSource, queries: list[Query], at: float) -> WindowValues:
    out: WindowValues = {}
    for query in queries:
        values = source.window_values(query, at)
        assert isinstance(values, dict)  # the activity window: rows per GPU key, not per target
        for key, rows in values.items():
            out.setdefault(key, {}).update(rows)
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def test_raw_chain_samples_give_prometheus_own_aggregates(
    k8s: client.ApiClient,
    namespace: str,
    prometheus_url: str,
    gpu_nodes: GPUNodes,
    simulator: RunningSimulator,
) -> None:
    client.AppsV1Api(k8s).create_namespaced_deployment(namespace, deployment("busy", 2, 1, gpu_nodes.label))
    wait_for(lambda: len(simulator.sim.holders()) == 2, 90, what="two simulated GPUs held by the pods")
    uuids = sorted(simulator.sim.uuid_of(node.name, i) for node in gpu_nodes.nodes for i in range(node.gpus))
    matchers = f'simulator="{simulator.target}"'
    source = PrometheusSource(PrometheusConfig(url=prometheus_url, matchers=matchers, timeout=30))
    raw = chain_sample_queries(uuids, WINDOW_S, matchers)
    aggregated = listed_window_queries(
        Window.ACTIVITY, WINDOW_S, uuid_alternatives(uuids), matchers, chain_only=True
    )
    assert raw
    assert aggregated

    count, spread = FIELDS.index("count"), FIELDS.index("stddev")

    def settled() -> float | None:
        """An instant whose window holds enough samples of every GPU and busy (varying) values:
        5 s back, so every sample up to it is ingested (scrapes every 1 s) and both forms read the same."""
        at = round(time.time() - 5, 3)
        rows = _rows(source, raw or [], at)
        counts = [r[count] for by in rows.values() for r in by.values()]
        varied = any(by[Signal.GPU_UTIL][spread] > 0 for by in rows.values() if Signal.GPU_UTIL in by)
        return at if len(rows) == len(uuids) and counts and min(counts) >= WINDOW_S / 2 and varied else None

    at = wait_for(settled, 120, interval=1, what="every simulated GPU with a window of samples, some busy")
    want, got = _rows(source, aggregated, at), _rows(source, raw, at)
    assert set(got) == set(want) == {(u, "") for u in uuids}
    compared = 0
    for key, by_signal in want.items():
        assert set(got[key]) == set(by_signal) == set(CHAIN_PLAN), key
        for signal, row in by_signal.items():
            mismatched = [
                (i, a, b)
                for i, (a, b) in enumerate(zip(row, got[key][signal], strict=True))
                if not _same(a, b)
            ]
            assert not mismatched, (key, signal, mismatched)
            compared += 1
    assert compared == len(uuids) * len(CHAIN_PLAN)
    # Prometheus' own stddev varies too: the spread was compared, not two zeros
    assert max(rows[Signal.GPU_UTIL][spread] for rows in want.values()) > 0

    # the whole window of every GPU (a restart's first cycle), by UUID ending: bit for bit
    whole = whole_sample_queries(WINDOW_S, matchers)
    assert whole
    keys = {(u, "") for u in uuids}
    want = _rows(source, listed_window_queries(Window.ACTIVITY, WINDOW_S, None, matchers) or [], at)
    got = _rows(source, whole, at)
    assert set(got) == set(want) == keys
    for key, by_signal in want.items():
        assert set(by_signal) <= set(WHOLE_PLAN)
        assert set(got[key]) == set(by_signal), key
        for signal, row in by_signal.items():
            exact = [(i, a, b) for i, (a, b) in enumerate(zip(row, got[key][signal], strict=True)) if a != b]
            assert all(math.isnan(a) and math.isnan(b) for _, a, b in exact), (key, signal, exact)
    served = {signal for by_signal in want.values() for signal in by_signal}
    assert len(served) >= 10, served  # the simulator serves most of the window's signals
