"""Every dcgm-exporter generation read at the source boundary (issue 30): node labels, both DCGM name
families, units normalised once, each GPU's generation and blind spots, the default job matcher."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping

import httpx
import pytest
from tests.unit.sources.metrics.fake_http import form, json_answer

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import FIELDS, GENERATIONS, Family, Generation
from gpu_efficiency.config import DEFAULT_MATCHERS
from gpu_efficiency.engine.model import Signal, Window
from gpu_efficiency.sources.metrics.base import FetchRequest
from gpu_efficiency.sources.metrics.labels import node_of
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource
from gpu_efficiency.sources.metrics.prometheus import exporter_inventory as inv
from gpu_efficiency.sources.metrics.prometheus.answers import identities
from gpu_efficiency.sources.metrics.prometheus.promql import (
    AGG_LABEL,
    cycle_queries,
    idle_candidates_query,
    name_regex,
    over,
    pcie_filter,
    served_names,
    window_query,
)
from gpu_efficiency.sources.metrics.prometheus.windows import samples

NOW = 1_700_000_000.0

# ---- node labels ---------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["hostname", "Hostname", "kubernetes_node", "node", "nodename"])
def test_every_node_label_names_the_node(label: str) -> None:
    assert node_of({label: "gpu-node-1", "UUID": "GPU-1"}) == "gpu-node-1"


def test_dcgm_exporters_own_labels_win_over_a_scrape_configs() -> None:
    assert node_of({"hostname": "a", "node": "b"}) == "a"
    assert node_of({"Hostname": "a", "kubernetes_node": "b"}) == "a"


def test_the_identity_query_asks_for_the_hostname_label_and_identities_read_it() -> None:
    assert "hostname," in cycle_queries({Window.ACTIVITY: 600.0})[0].text
    got = identities([({"UUID": "GPU-1", "hostname": "n1", "pod": "p", "namespace": "ns"}, 1.0)])
    (ident,) = got.values()
    assert ident.node == "n1"


def test_a_gpu_with_no_node_label_keeps_the_labels_it_has() -> None:
    (ident,) = identities([({"UUID": "GPU-1", "gpu": "0", "modelName": "H100"}, 1.0)]).values()
    assert ident.node == ""
    assert ident.labels == {"UUID", "gpu", "modelName"}


# ---- both name families, units normalised once ----------------------------------------------------


@pytest.mark.parametrize("spec", FIELDS, ids=lambda s: s.signal)
def test_every_field_is_selected_under_both_names(spec: ef.FieldSpec) -> None:
    signal = Signal[spec.signal]
    text = over(signal, "max_over_time", "60s", 'job="x"')
    for _, names in served_names(signal):
        assert name_regex(names) in text  # one selector per unit: a name, or an anchored regex
    for name in (spec.legacy, spec.current):
        assert any(re.fullmatch(name_regex(names), name) for _, names in served_names(signal)), name
    assert 'job="x"' in text


def test_the_name_regex_matches_exactly_its_names() -> None:
    for spec in FIELDS:
        names = tuple(dict.fromkeys([spec.legacy, spec.current]))
        regex = name_regex(names)
        assert all(re.fullmatch(regex, n) for n in names)
        others = {s.legacy for s in FIELDS} | {s.current for s in FIELDS}
        assert {n for n in others if re.fullmatch(regex, n)} == set(names)


def test_the_old_clock_event_name_is_read_too() -> None:
    ((_, names),) = served_names(Signal.CLOCK_EVENTS)
    assert re.fullmatch(name_regex(names), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert re.fullmatch(name_regex(names), "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def test_gpu_util_ratio_is_scaled_to_percent_for_values_not_for_counts() -> None:
    """DCGM_FI_DEV_GPU_UTIL_RATIO (0-1) reaches the engine in percent, like DCGM_FI_DEV_GPU_UTIL:
    a busy GPU at 0.9 must never read 0.9 % (the idle threshold's side)."""
    assert served_names(Signal.GPU_UTIL) == (
        (1.0, ("DCGM_FI_DEV_GPU_UTIL",)),
        (100.0, ("DCGM_FI_DEV_GPU_UTIL_RATIO",)),
    )
    for func in ("max_over_time", "avg_over_time", "min_over_time", "last_over_time", "stddev_over_time"):
        text = over(Signal.GPU_UTIL, func, "60s", "")
        assert text == f"({func}(DCGM_FI_DEV_GPU_UTIL[60s]) or {func}(DCGM_FI_DEV_GPU_UTIL_RATIO[60s]) * 100)"
    for func in ("count_over_time", "changes", "resets"):
        assert "* 100" not in over(Signal.GPU_UTIL, func, "60s", "")
    activity = window_query(Window.ACTIVITY, 600.0).text
    assert "max_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO[600s]) * 100" in activity
    assert "count_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO[600s]))" in activity
    assert "timestamp(DCGM_FI_DEV_GPU_UTIL_RATIO)" in activity
    # the idle filter and the PCIe filter compare in percent too
    idle = idle_candidates_query(600.0, 0.01).text
    assert "max_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO[600s]) * 100)) < 1.000001" in idle
    assert any("DCGM_FI_DEV_GPU_UTIL_RATIO[120s]) * 100) >= " in part for part in pcie_filter("120s", ""))


def test_ratio_and_celsius_fields_need_no_factor() -> None:
    for signal in (Signal.SM_ACTIVE, Signal.GR_ENGINE_ACTIVE, Signal.GPU_TEMP, Signal.POWER, Signal.XID):
        assert len(served_names(signal)) == 1, signal  # one selector, one unit
        assert "*" not in over(signal, "max_over_time", "60s", "")


def test_the_activity_query_stays_under_victoriametrics_16_kib_limit() -> None:
    assert len(window_query(Window.ACTIVITY, 600.0, DEFAULT_MATCHERS).text) < 16 * 1024


# ---- which generation each GPU speaks --------------------------------------------------------------


def served_by(generation: Generation) -> tuple[set[str], str]:
    """The metric names and the node label a generation's exporter serves (api/exporter_fields)."""
    spec = GENERATIONS[generation]
    names = set()
    for field in FIELDS:
        if field.signal in ef.PROFILING_SIGNALS and not spec.profiling:
            continue
        if field.kind == "ecc" and not spec.ecc:
            continue
        names.add(spec.name(field.signal))
    if spec.exporter_counters:
        names |= {ef.XID_COUNT, ef.CLOCK_EVENTS_COUNT}
    return names, spec.node_label


def mask_of(names: Iterable[str], label: str) -> int:
    """What the inventory query's sum gives for a GPU serving ``names`` with ``label``: its features
    evaluated as Prometheus would (a feature is served when one of its names is, with its label)."""
    mask = 0
    for feature, metrics, extra in inv.FEATURES:
        needs = extra.split("!=", 1)[0] if extra else ""
        if set(metrics) & set(names) and (not needs or needs == label):
            mask |= inv.BITS[feature]
    return mask


@pytest.mark.parametrize("generation", list(GENERATIONS), ids=str)
def test_each_generation_is_told_from_what_it_serves(generation: Generation) -> None:
    view = inv.view_of(mask_of(*served_by(generation)))
    assert view.generation is generation
    assert view.xid_counter is GENERATIONS[generation].exporter_counters


def test_the_default_csv_is_blind_to_ecc_and_the_profiling_inputs() -> None:
    view = inv.view_of(mask_of(*served_by(Generation.DEFAULT_CSV)))
    assert {"ecc", "profiling", "occupancy", "tensor", "dram", "pcie-throughput"} <= view.blind
    assert "xid" not in view.blind
    assert "thermal" not in view.blind
    full = inv.view_of(mask_of(*served_by(Generation.V4_9)))
    assert full.blind == {"memory"}  # served, but in a unit no public source settles (below)
    assert inv.view_of(mask_of(*served_by(Generation.V4_8_3))).blind == frozenset()


def test_the_inventory_query_is_one_series_per_gpu_and_short() -> None:
    text = inv.inventory_query(DEFAULT_MATCHERS)
    assert text.startswith("sum by (UUID, GPU_I_ID) (")
    assert len(text) < 16 * 1024
    assert len(inv.FEATURES) < 53  # the mask stays an exact float


def test_a_mixed_fleet_is_decided_per_gpu() -> None:
    legacy, current = mask_of(*served_by(Generation.LEGACY)), mask_of(*served_by(Generation.V4_9))
    views = inv.inventory([({"UUID": "GPU-1"}, float(legacy)), ({"UUID": "GPU-2"}, float(current))])
    assert views[("GPU-1", "")].generation is Generation.LEGACY
    assert views[("GPU-2", "")].generation is Generation.V4_9


@pytest.mark.parametrize("value", [math.nan, -1.0, float(1 << 60)])
def test_a_mask_that_is_not_one_is_ignored(value: float) -> None:
    assert inv.inventory([({"UUID": "GPU-1"}, value)]) == {}


def test_fb_and_sm_clock_of_a_4_9_gpu_are_not_read_as_amounts() -> None:
    """Same names in both families, unit MiB/MHz in DCGM 4.6 but bytes/Hz in 4.9's notes: on a 4.9+
    GPU they are dropped, elsewhere kept."""
    row = [1.0, 1.0, 1.0, 1.0, 10.0, NOW, 0.0, 0.0, 0.0]  # aggregate_rows.FIELDS
    rows = {
        ("GPU-1", ""): {Signal.FB_USED: list(row), Signal.SM_CLOCK: list(row), Signal.GPU_TEMP: list(row)},
        ("GPU-2", ""): {Signal.FB_USED: list(row), Signal.SM_CLOCK: list(row), Signal.GPU_TEMP: list(row)},
    }
    ident = identities(
        [({"UUID": "GPU-1", "hostname": "n1"}, 1.0), ({"UUID": "GPU-2", "Hostname": "n2"}, 1.0)]
    )
    views = {
        ("GPU-1", ""): inv.view_of(mask_of(*served_by(Generation.V4_9))),
        ("GPU-2", ""): inv.view_of(mask_of(*served_by(Generation.V4))),
    }
    request = FetchRequest(now=NOW, windows={Window.ACTIVITY: 150.0}, scrape_interval=15.0)
    by_uuid = {g.uuid: g for g in samples(ident, {Window.ACTIVITY: rows}, request, views=views)}
    assert set(by_uuid["GPU-1"].stats[Window.ACTIVITY]) == {Signal.GPU_TEMP}
    assert set(by_uuid["GPU-2"].stats[Window.ACTIVITY]) == {Signal.FB_USED, Signal.SM_CLOCK, Signal.GPU_TEMP}
    assert (by_uuid["GPU-1"].exporter, by_uuid["GPU-2"].exporter) == ("4.9+", "4.x")
    # what is dropped is blind, never healthy (SignalsComplete names it)
    assert "memory" in by_uuid["GPU-1"].blind
    assert "memory" not in by_uuid["GPU-2"].blind
    assert (by_uuid["GPU-1"].node, by_uuid["GPU-2"].node) == ("n1", "n2")


# ---- a fetch against Prometheus answers of a 4.8.3+ exporter ---------------------------------------


def _answer(query: str) -> list[tuple[Mapping[str, str], float]]:
    if query.startswith("sum by (UUID, GPU_I_ID)"):  # the inventory
        return [({"UUID": "GPU-1"}, float(mask_of(*served_by(Generation.V4_8_3))))]
    if query.startswith("group by (UUID, GPU_I_ID, gpu"):  # identity: dcgm-exporter #655's label
        return [({"UUID": "GPU-1", "gpu": "0", "hostname": "n1", "pod": "p", "namespace": "ns"}, 1.0)]
    if AGG_LABEL in query and "GPU_UTIL:max" in query:
        return [({"UUID": "GPU-1", AGG_LABEL: "GPU_UTIL:max"}, 90.0)]
    return []


def test_a_fetch_ties_a_hostname_labelled_gpu_to_its_node_and_generation() -> None:
    """Fails on the code before issue 30: ``hostname`` was no node label, so the GPU had no node
    and no pod sample could be tied to it."""

    def handle(request: httpx.Request) -> httpx.Response:
        query = form(request)["query"][0]
        result = [{"metric": dict(m), "value": [NOW, str(v)]} for m, v in _answer(query)]
        return json_answer(
            json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        )

    source = PrometheusSource(
        PrometheusConfig(url="http://prometheus.test"), transport=httpx.MockTransport(handle)
    )
    result = source.fetch(FetchRequest(now=NOW, windows={Window.ACTIVITY: 600.0}, scrape_interval=15.0))
    (gpu,) = result.gpus
    assert gpu.node == "n1"
    assert gpu.exporter == Generation.V4_8_3.value
    assert gpu.xid_events == {}  # the counter is served: XIDs are counted (none yet)
    assert result.queries == 3  # identity, inventory, activity: constant


# ---- the default job matcher -------------------------------------------------------------------------

JOB = re.compile(r'job=~"(.*)"')


@pytest.mark.parametrize(
    "job",
    [
        "nvidia-dcgm-exporter",  # the GPU Operator's Service
        "dcgm-exporter",  # dcgm-exporter's chart installed as `helm install dcgm-exporter`
        "dcgm-dcgm-exporter",  # `helm install dcgm ...`: <release>-dcgm-exporter
        "dcgm-exporter-1700000000",  # the chart README's --generate-name
        "gpu-metrics",
        "dcgm",
        "node-agent",
    ],
)
def test_the_default_matcher_reads_the_jobs_the_charts_create(job: str) -> None:
    match = JOB.fullmatch(DEFAULT_MATCHERS)
    assert match is not None
    assert re.fullmatch(match.group(1), job)  # Prometheus anchors label regexes


@pytest.mark.parametrize("job", ["node-exporter", "kube-state-metrics", "prometheus", "dcgm-other"])
def test_the_default_matcher_reads_no_other_job(job: str) -> None:
    match = JOB.fullmatch(DEFAULT_MATCHERS)
    assert match is not None
    assert not re.fullmatch(match.group(1), job)


def test_generations_cover_both_families() -> None:
    assert {spec.family for spec in GENERATIONS.values()} == {Family.LEGACY, Family.CURRENT}
