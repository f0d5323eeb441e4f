"""The fault candidates query checks every GPU's PCIe link every LINK_CHECK_S only; in between, the
GPUs the last check named keep their fault window fetched, in both fetch paths.

The fake Prometheus names a GPU whose link is down only when the candidates query carries the link
terms, as Prometheus would, and records every query, through ``httpx.MockTransport``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from tests.unit.sources.metrics.fake_http import form, json_answer, range_selector

from gpu_efficiency.engine.model import Window
from gpu_efficiency.sources.metrics.base import ActivityHints, FaultHints, FetchRequest, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.link_check import LINK_CHECK_S
from gpu_efficiency.sources.metrics.prometheus.promql import (
    MAX_LISTED_GPUS,
    candidates_query,
    restricted_queries,
)

NOW = 1_700_000_000.0
WINDOWS = {Window.ACTIVITY: 120.0, Window.FAULT: 120.0}
LINK_TERM = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
GPUS = ("GPU-1", "GPU-2", "GPU-3")


@dataclass
class FakePrometheus:
    down: set[str] = field(default_factory=set)  # GPUs whose link the link terms name
    faulted: set[str] = field(default_factory=set)  # GPUs the other fault terms name
    fail_candidates: bool = False
    queries: list[str] = field(default_factory=list)

    def answer(self, query: str) -> list[tuple[dict[str, str], Any]]:
        if query.startswith(("group by (UUID, GPU_I_ID, gpu", "max by (UUID, GPU_I_ID, gpu")):
            value = NOW - 3 if query.startswith("max") else 1
            return [({"UUID": u, "gpu": "0", "Hostname": "n1"}, value) for u in GPUS]
        if "gpueff_window" in query:
            named = self.faulted | (self.down if LINK_TERM in query else set())
            return [({"UUID": u, "gpueff_window": "fault"}, 1) for u in sorted(named)]
        return []

    def handle(self, request: httpx.Request) -> httpx.Response:
        query = form(request)["query"][0]
        self.queries.append(query)
        if self.fail_candidates and "gpueff_window" in query:
            error = {"status": "error", "errorType": "execution", "error": "query timed out"}
            return json_answer(json.dumps(error).encode(), status=422)
        result = [{"metric": m, "value": [NOW, str(v)]} for m, v in self.answer(query)]
        # a plain range selector (the activity window as raw samples) gets a matrix: no series here
        kind = "matrix" if range_selector(query) else "vector"
        body = {"status": "success", "data": {"resultType": kind, "result": result}}
        return json_answer(json.dumps(body).encode())

    def cycle(self) -> tuple[bool, set[str]]:
        """Since the last call: did the candidates query check links, and which GPUs' fault windows
        were fetched (listed in a fault window query)."""
        candidates = [q for q in self.queries if "gpueff_window" in q]
        assert len(candidates) == 1
        windows = [q for q in self.queries if "ECC_DBE" in q and "gpueff_window" not in q]
        self.queries.clear()
        return LINK_TERM in candidates[0], {u for u in GPUS if any(f'"{u}"' in q for q in windows)}


@pytest.fixture(params=[0, 1], ids=["plain", "tiered"])
def setup(request: pytest.FixtureRequest) -> tuple[FakePrometheus, PrometheusSource]:
    fake = FakePrometheus()
    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test"),
        refresh_budget=request.param,
        transport=httpx.MockTransport(fake.handle),
    )
    return fake, source


def _fetch(
    source: PrometheusSource, now: float, matchers: str = "", windows: dict[Window, float] = WINDOWS
) -> None:
    source.config = PrometheusConfig(url="http://prometheus.test", matchers=matchers)
    request = FetchRequest(
        now=now,
        windows=windows,
        scrape_interval=15.0,
        hints=FaultHints(),
        activity=ActivityHints(idle_below=0.01),
    )
    source.fetch(request)
    assert source.wait_refreshes(10)


def test_links_are_checked_every_link_check_s_only(setup: tuple[FakePrometheus, PrometheusSource]) -> None:
    fake, source = setup
    checked = []
    for step in range(8):  # cycles of 30 s: checks at 0, 90 and 180 s
        _fetch(source, NOW + 30 * step)
        checked.append(fake.cycle()[0])
    assert LINK_CHECK_S == 90
    assert checked == [True, False, False, True, False, False, True, False]


def test_a_short_lookback_is_checked_every_lookback(setup: tuple[FakePrometheus, PrometheusSource]) -> None:
    fake, source = setup
    checked = []
    for step in range(7):  # cycles of 5 s, lookback 15 s: a link down for the lookback named <= 15 s later
        _fetch(source, NOW + 5 * step, windows={Window.ACTIVITY: 20.0, Window.FAULT: 15.0})
        checked.append(fake.cycle()[0])
    assert checked == [True, False, False, True, False, False, True]


def test_a_gpu_the_check_named_keeps_its_fault_window_between_checks(
    setup: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = setup
    fake.down = {"GPU-2"}
    _fetch(source, NOW)
    assert fake.cycle() == (True, {"GPU-2"})
    for step in (1, 2):  # no link terms sent, the GPU still fetched (it may recover or worsen)
        _fetch(source, NOW + 30 * step)
        assert fake.cycle() == (False, {"GPU-2"})
    fake.down = set()  # the link trained back: the next check drops it
    _fetch(source, NOW + 90)
    assert fake.cycle() == (True, set())
    _fetch(source, NOW + 120)
    assert fake.cycle() == (False, set())


def test_other_fault_terms_still_run_every_cycle(setup: tuple[FakePrometheus, PrometheusSource]) -> None:
    fake, source = setup
    _fetch(source, NOW)
    fake.cycle()
    fake.faulted = {"GPU-3"}  # an ECC error between checks: named the same cycle
    _fetch(source, NOW + 30)
    assert fake.cycle() == (False, {"GPU-3"})


def test_a_link_that_goes_down_between_checks_is_named_at_the_next_check(
    setup: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = setup
    _fetch(source, NOW)
    fake.cycle()
    fake.down = {"GPU-1"}
    _fetch(source, NOW + 30)
    assert fake.cycle() == (False, set())  # up to LINK_CHECK_S later than a check every cycle
    _fetch(source, NOW + 60)
    assert fake.cycle() == (False, set())
    _fetch(source, NOW + 90)
    assert fake.cycle() == (True, {"GPU-1"})


@pytest.mark.parametrize(
    ("later", "matchers"), [(-30.0, ""), (30.0, 'job="dcgm"')], ids=["clock-back", "new-matchers"]
)
def test_a_clock_that_went_back_or_other_matchers_check_again(
    setup: tuple[FakePrometheus, PrometheusSource], later: float, matchers: str
) -> None:
    fake, source = setup
    _fetch(source, NOW)
    fake.cycle()
    _fetch(source, NOW + later, matchers)
    assert fake.cycle()[0]


def test_a_check_that_failed_is_made_again_next_cycle(setup: tuple[FakePrometheus, PrometheusSource]) -> None:
    fake, source = setup
    fake.fail_candidates = True
    with pytest.raises(SourceUnavailable):
        _fetch(source, NOW)
    fake.queries.clear()
    fake.fail_candidates = False
    fake.down = {"GPU-2"}
    _fetch(source, NOW + 30)
    assert fake.cycle() == (True, {"GPU-2"})


def test_without_links_the_candidates_query_leaves_out_the_link_terms_only() -> None:
    hints = FaultHints(gpu_temperature_above=90.0)
    windows = {**WINDOWS, Window.THERMAL_HOLD: 60.0}
    full = candidates_query(windows, hints, links=True)
    cut = candidates_query(windows, hints, links=False)
    assert full is not None
    assert cut is not None
    assert full.checks_links
    assert not cut.checks_links
    assert LINK_TERM in full.text
    assert "PCIE" not in cut.text
    for kept in ("ECC_DBE_VOL_TOTAL", "XID_ERRORS_COUNT", "RETIRED", "GPU_TEMP", "thermal-hold"):
        assert kept in cut.text
    no_fault = candidates_query({Window.ACTIVITY: 120.0, Window.THERMAL_HOLD: 60.0}, hints, links=True)
    assert no_fault is not None
    assert not no_fault.checks_links


def test_too_many_candidates_fall_back_to_the_filter_with_link_terms() -> None:
    keys = [(f"GPU-{i:05d}", "") for i in range(MAX_LISTED_GPUS + 1)]
    queries = restricted_queries(Window.FAULT, 120.0, FaultHints(), keys)
    assert queries
    assert all(LINK_TERM in q.text for q in queries)
    assert all(q.keys is None for q in queries)
