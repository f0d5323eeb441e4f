"""The exporter inventory is read again only when a GPU's exporter may have changed (new GPU, other
scrape targets, its age, other matchers), in both fetch paths; steady cycles do without it.

The fake Prometheus answers identity (with each GPU's scrape target) and the inventory (each GPU's
feature bitmask) from a small model, through ``httpx.MockTransport``, and records every query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from tests.unit.sources.metrics.fake_http import form, json_answer

from gpu_efficiency.engine.model import Window
from gpu_efficiency.sources.metrics.base import ActivityHints, FetchRequest, FetchResult, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.exporter_inventory import BITS
from gpu_efficiency.sources.metrics.prometheus.inventory_cache import INVENTORY_REFRESH_S

NOW = 1_700_000_000.0
WINDOWS = {Window.ACTIVITY: 120.0}
#: dcgm-exporter 4.x (legacy names, Hostname) and 4.9 (DCGM 4.6 names, hostname), as the inventory sees them.
V4 = BITS["legacy-names"] | BITS["label-Hostname"] | BITS["ecc"] | BITS["occupancy"] | BITS["profiling"]
V4_9 = BITS["current-names"] | BITS["label-hostname"] | BITS["ecc"] | BITS["occupancy"] | BITS["profiling"]


@dataclass
class Exporter:
    target: str  # its scrape target (``instance``)
    mask: int = V4


@dataclass
class FakePrometheus:
    gpus: dict[str, Exporter] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    fail_inventory: bool = False  # the inventory query gets a PromQL error

    def answer(self, query: str) -> list[tuple[dict[str, str], Any]]:
        if query.startswith(("group by (UUID, GPU_I_ID, gpu", "max by (UUID, GPU_I_ID, gpu")):
            value = NOW - 3 if query.startswith("max") else 1
            return [
                ({"UUID": u, "gpu": "0", "Hostname": "n1", "instance": e.target}, value)
                for u, e in self.gpus.items()
            ]
        if "gpueff_has" in query:
            return [({"UUID": u}, e.mask) for u, e in self.gpus.items()]
        return []

    def handle(self, request: httpx.Request) -> httpx.Response:
        query = form(request)["query"][0]
        self.queries.append(query)
        if self.fail_inventory and "gpueff_has" in query:
            error = {"status": "error", "errorType": "execution", "error": "query timed out"}
            return json_answer(json.dumps(error).encode(), status=422)
        result = [{"metric": m, "value": [NOW, str(v)]} for m, v in self.answer(query)]
        kind = "matrix" if query.endswith("]") else "vector"  # a range selector: raw chain samples
        body = {"status": "success", "data": {"resultType": kind, "result": result}}
        return json_answer(json.dumps(body).encode())

    def inventories(self) -> int:
        """Inventory queries sent since the last call."""
        sent = sum("gpueff_has" in q for q in self.queries)
        self.queries.clear()
        return sent


@pytest.fixture(params=[0, 1], ids=["plain", "tiered"])
def setup(request: pytest.FixtureRequest) -> tuple[FakePrometheus, PrometheusSource]:
    fake = FakePrometheus({"GPU-1": Exporter("10.0.0.1:9400"), "GPU-2": Exporter("10.0.0.1:9400")})
    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test"),
        refresh_budget=request.param,
        transport=httpx.MockTransport(fake.handle),
    )
    return fake, source


@pytest.fixture
def read(setup: tuple[FakePrometheus, PrometheusSource]) -> tuple[FakePrometheus, PrometheusSource]:
    """``setup`` after its first fetch (which read the inventory), the fake's count cleared."""
    fake, source = setup
    _fetch(source, NOW)
    fake.inventories()
    return setup


def _fetch(source: PrometheusSource, now: float) -> FetchResult:
    request = FetchRequest(
        now=now, windows=WINDOWS, scrape_interval=15.0, activity=ActivityHints(idle_below=0.01)
    )
    result = source.fetch(request)
    assert source.wait_refreshes(10)
    return result


def _generations(result: FetchResult) -> dict[str, str]:
    return {g.uuid: g.exporter for g in result.gpus}


def test_steady_cycles_keep_the_read_inventory(setup: tuple[FakePrometheus, PrometheusSource]) -> None:
    fake, source = setup
    assert _generations(_fetch(source, NOW)) == {"GPU-1": "4.x", "GPU-2": "4.x"}
    assert fake.inventories() == 1
    for step in range(1, 9):  # 8 cycles of 30 s: under INVENTORY_REFRESH_S
        assert _generations(_fetch(source, NOW + 30 * step)) == {"GPU-1": "4.x", "GPU-2": "4.x"}
        assert fake.inventories() == 0


def test_a_new_gpu_is_inventoried_in_the_cycle_that_first_names_it(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = read
    fake.gpus["GPU-3"] = Exporter("10.0.0.2:9400", V4_9)
    assert _generations(_fetch(source, NOW + 30)) == {"GPU-1": "4.x", "GPU-2": "4.x", "GPU-3": "4.9+"}
    assert fake.inventories() == 1
    _fetch(source, NOW + 60)
    assert fake.inventories() == 0  # and not again while it stays behind the same target


def test_an_exporter_restarted_behind_a_new_address_is_read_again_at_once(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    """A rolling upgrade of dcgm-exporter gives its pod a new address: the GPU's new generation
    (4.9: other names, memory in an ambiguous unit) is read in the cycle that first sees it."""
    fake, source = read
    fake.gpus["GPU-1"] = Exporter("10.0.0.9:9400", V4_9)
    assert _generations(_fetch(source, NOW + 30)) == {"GPU-1": "4.9+", "GPU-2": "4.x"}
    assert fake.inventories() == 1


def _after(result: FetchResult, source: PrometheusSource) -> None:
    """What the cycle does once it has made its writes: the source's deferred reads, waited for."""
    assert result.then is not None
    result.then()
    assert source.wait_refreshes(10)


def test_an_exporter_upgraded_behind_the_same_address_is_read_within_the_refresh_period(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    """The periodic read is made after the cycle, not in it (at 8,000 GPUs it cost Prometheus 3-4 s
    of CPU in every tenth cycle): the cycle past the period keeps the old view, the next one has
    the new."""
    fake, source = read
    fake.gpus["GPU-1"].mask = V4_9
    early = _fetch(source, NOW + INVENTORY_REFRESH_S - 1)
    _after(early, source)
    assert _generations(early)["GPU-1"] == "4.x"  # the kept view, and nothing read after it
    assert fake.inventories() == 0
    due = _fetch(source, NOW + INVENTORY_REFRESH_S)
    assert _generations(due)["GPU-1"] == "4.x"
    assert fake.inventories() == 0  # not in the cycle
    _after(due, source)
    assert fake.inventories() == 1  # after it
    assert _generations(_fetch(source, NOW + INVENTORY_REFRESH_S + 30))["GPU-1"] == "4.9+"
    assert fake.inventories() == 0
    _after(_fetch(source, NOW + INVENTORY_REFRESH_S + 60), source)
    assert fake.inventories() == 0  # the read at NOW + INVENTORY_REFRESH_S is the one kept


def test_a_background_read_that_failed_changes_nothing_and_is_tried_after_the_next_cycle(
    read: tuple[FakePrometheus, PrometheusSource], caplog: pytest.LogCaptureFixture
) -> None:
    fake, source = read
    fake.gpus["GPU-1"].mask = V4_9
    fake.fail_inventory = True
    due = _fetch(source, NOW + INVENTORY_REFRESH_S)
    _after(due, source)
    assert fake.inventories() == 1
    assert "exporter inventory in the background failed" in caplog.text
    fake.fail_inventory = False
    later = _fetch(source, NOW + INVENTORY_REFRESH_S + 30)
    assert _generations(later)["GPU-1"] == "4.x"  # the failed read kept nothing
    _after(later, source)
    assert fake.inventories() == 1
    assert _generations(_fetch(source, NOW + INVENTORY_REFRESH_S + 60))["GPU-1"] == "4.9+"


def test_an_inventory_twice_the_period_old_is_read_in_the_cycle(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    """Background reads that never succeed (or cycles that never ran their ``then``) do not leave a
    view older than twice the period: the cycle reads it, and its failure is the fetch's."""
    fake, source = read
    fake.gpus["GPU-1"].mask = V4_9
    assert _generations(_fetch(source, NOW + 2 * INVENTORY_REFRESH_S - 1))["GPU-1"] == "4.x"
    assert fake.inventories() == 0
    assert _generations(_fetch(source, NOW + 2 * INVENTORY_REFRESH_S))["GPU-1"] == "4.9+"
    assert fake.inventories() == 1
    fake.fail_inventory = True
    with pytest.raises(SourceUnavailable):
        _fetch(source, NOW + 4 * INVENTORY_REFRESH_S)


def test_a_background_read_keeps_the_targets_of_its_cycle(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    """The read after a cycle is kept with the scrape targets that cycle's identity named: an
    exporter that moved to a new address after it is still read again at once."""
    fake, source = read
    _after(_fetch(source, NOW + INVENTORY_REFRESH_S), source)
    assert fake.inventories() == 1
    fake.gpus["GPU-2"] = Exporter("10.0.0.7:9400", V4_9)
    assert _generations(_fetch(source, NOW + INVENTORY_REFRESH_S + 30))["GPU-2"] == "4.9+"
    assert fake.inventories() == 1


def test_new_matchers_or_a_clock_gone_back_read_it_again(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = read
    source.config = PrometheusConfig(url="http://prometheus.test", matchers='job="dcgm"')
    _fetch(source, NOW + 30)
    assert fake.inventories() == 1
    _fetch(source, NOW + 60)
    assert fake.inventories() == 0
    _fetch(source, NOW)  # the operator's clock stepped back a minute
    assert fake.inventories() == 1


def test_a_gpu_gone_or_back_behind_its_old_target_needs_no_read(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = read
    del fake.gpus["GPU-2"]  # a node drained: nothing new to learn
    assert _generations(_fetch(source, NOW + 30)) == {"GPU-1": "4.x"}
    assert fake.inventories() == 0
    fake.gpus["GPU-2"] = Exporter("10.0.0.1:9400")  # back behind its old target: the kept view
    assert _generations(_fetch(source, NOW + 60)) == {"GPU-1": "4.x", "GPU-2": "4.x"}
    assert fake.inventories() == 0


def test_a_read_that_failed_is_tried_again_the_next_cycle(
    read: tuple[FakePrometheus, PrometheusSource],
) -> None:
    fake, source = read
    fake.gpus["GPU-1"] = Exporter("10.0.0.9:9400", V4_9)
    fake.fail_inventory = True
    with pytest.raises(SourceUnavailable):
        _fetch(source, NOW + 30)
    assert fake.inventories() == 1
    fake.fail_inventory = False
    assert _generations(_fetch(source, NOW + 60))["GPU-1"] == "4.9+"
    assert fake.inventories() == 1
