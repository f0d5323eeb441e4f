"""The simulator serves every dcgm-exporter generation, per node: names, units, node label, counters."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_efficiency.api import exporter_fields as ef
from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.faults import Fault, FaultKind
from gpu_efficiency_sim.generations import COUNT_WINDOW_MS, NOT_IN_DEFAULT_CSV, SIMULATED
from gpu_efficiency_sim.gpu_models import find_model
from gpu_efficiency_sim.scenario import ScenarioError, json_schema, parse_scenario
from gpu_efficiency_sim.simulator import SimNode, SimOptions, Simulator
from tests.unit.sim.helpers import FakeClock

H100 = find_model("NVIDIA-H100-80GB-HBM3")


def fleet(
    *generations: Generation | None, faults: tuple[Fault, ...] = (), options: SimOptions | None = None
) -> Simulator:
    """One one-GPU node per generation, named n0, n1, ... (None: the simulator's default)."""
    nodes = [SimNode(f"n{i}", 1, H100, exporter=g) for i, g in enumerate(generations)]
    return Simulator(nodes, faults=faults, options=options, clock=FakeClock())


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by its exposed name (the parser adds _total to a counter's samples: removed)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = family.name if s.name == family.name + "_total" else s.name
            out.setdefault(name, []).append((s.labels, s.value))
    return out


def node_of(labels: dict[str, str]) -> str:
    return labels.get("hostname") or labels["Hostname"]


def by_node(text: str, name: str) -> dict[str, float]:
    return {node_of(labels): value for labels, value in series(text).get(name, [])}


def test_the_default_is_todays_exporter_old_names_and_the_capitalised_hostname_label() -> None:
    text = fleet(None).render(t=5.0)
    parsed = series(text)
    assert "DCGM_FI_DEV_GPU_UTIL" in parsed
    assert Signal.CLOCK_EVENTS.value in parsed
    assert parsed[Signal.SM_ACTIVE][0][0]["Hostname"] == "n0"
    assert "hostname" not in parsed[Signal.SM_ACTIVE][0][0]
    assert ef.XID_COUNT not in parsed


@pytest.mark.parametrize(
    ("generation", "label"),
    [
        (Generation.LEGACY, "Hostname"),
        (Generation.V4, "Hostname"),
        (Generation.V4_8_3, "hostname"),
        (Generation.V4_9, "hostname"),
        (Generation.DEFAULT_CSV, "hostname"),
    ],
)
def test_each_generation_names_the_node_with_its_label(generation: Generation, label: str) -> None:
    for samples in series(fleet(generation).render(t=5.0)).values():
        for labels, _ in samples:
            assert labels.get(label) == "n0"
            assert {"Hostname", "hostname"} - {label} & set(labels) == set()


def test_legacy_serves_the_old_clock_events_name() -> None:
    parsed = series(fleet(Generation.LEGACY).render(t=5.0))
    assert ef.OLD_CLOCK_EVENTS in parsed
    assert Signal.CLOCK_EVENTS.value not in parsed


def test_4_9_serves_every_renamed_field_under_its_dcgm_4_6_name_and_no_old_name() -> None:
    parsed = series(fleet(Generation.V4_9).render(t=5.0))
    for spec in ef.FIELDS:
        assert spec.current in parsed, spec.current
        if spec.renamed:
            assert spec.legacy not in parsed, spec.legacy
    for old, new in ef.EXTRA_RENAMES:
        if old in catalog.METRIC_NAMES:
            assert new in parsed
            assert old not in parsed


def test_4_9_units_ratio_hz_bytes_joules_from_the_same_readings() -> None:
    """One GPU, one instant: the canonical reading and what 4.9+ serves for it."""
    sim = fleet(Generation.V4_9)
    sim.set_pods([])
    canonical = sim.gpu_values("n0", 0, t=7.0)
    assert canonical is not None
    sim2 = fleet(Generation.V4_9)
    served = series(sim2.render(t=7.0))

    def one(name: str) -> float:
        return served[name][0][1]

    assert one("DCGM_FI_DEV_GPU_UTIL_RATIO") == pytest.approx(float(canonical[Signal.GPU_UTIL]) / 100)
    assert one(catalog.SM_CLOCK) == pytest.approx(float(canonical[catalog.SM_CLOCK]) * 1e6)
    assert one(catalog.MEM_CLOCK) == pytest.approx(float(canonical[catalog.MEM_CLOCK]) * 1e6)
    assert one(Signal.FB_FREE) == pytest.approx(float(canonical[Signal.FB_FREE]) * 1024 * 1024)
    assert one(catalog.FB_RESERVED) == pytest.approx(float(canonical[catalog.FB_RESERVED]) * 1024 * 1024)
    assert one("DCGM_FI_PROF_SM_UTIL_RATIO") == pytest.approx(float(canonical[Signal.SM_ACTIVE]))
    assert one("DCGM_FI_DEV_GPU_TEMP_CELSIUS") == float(canonical[Signal.GPU_TEMP])
    assert one("DCGM_FI_DEV_BOARD_POWER_WATTS") == pytest.approx(float(canonical[Signal.POWER]))
    # energy: J where 4.x serves mJ (the counter's own start differs per GPU; both grow with power)
    legacy_energy = series(fleet(Generation.V4).render(t=7.0))[catalog.ENERGY][0][1]
    assert one(catalog.ENERGY) < legacy_energy / 100
    text = sim2.render(t=8.0)
    assert "# HELP DCGM_FI_DEV_GPU_UTIL_RATIO GPU utilization (ratio 0-1)." in text
    assert "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in bytes)." in text


def test_default_csv_leaves_out_what_dcgm_exporters_default_counters_csv_comments_out() -> None:
    parsed = series(fleet(Generation.DEFAULT_CSV).render(t=5.0))
    for name in NOT_IN_DEFAULT_CSV:
        assert name not in parsed, name
    assert Signal.ECC_DBE_VOLATILE.value not in parsed
    assert ef.XID_COUNT not in parsed
    assert ef.CLOCK_EVENTS_COUNT not in parsed
    # on in the shipped CSV: GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE, the PCIe PROF rates
    for name in (Signal.GR_ENGINE_ACTIVE, Signal.TENSOR_ACTIVE, Signal.DRAM_ACTIVE, Signal.PCIE_RX_BYTES):
        assert name.value in parsed
    assert Signal.XID.value in parsed
    assert Signal.GPU_TEMP.value in parsed


def test_xid_count_counts_every_xid_in_the_window_where_the_gauge_shows_only_the_last() -> None:
    xid = FaultKind.XID
    faults = (
        Fault(xid, at=10, node="n0", gpu=0, value=79),
        Fault(xid, at=20, node="n0", gpu=0, value=79),
        Fault(xid, at=30, node="n0", gpu=0, value=13),
    )
    sim = fleet(Generation.V4_8_3, faults=faults)
    assert by_node(sim.render(t=5.0), ef.XID_COUNT) == {"n0": 0}
    zero = series(sim.render(t=5.0))[ef.XID_COUNT][0][0]
    assert ef.XID_LABEL not in zero
    assert zero[ef.WINDOW_LABEL] == str(COUNT_WINDOW_MS)
    at25 = series(sim.render(t=25.0))
    assert [(labels[ef.XID_LABEL], v) for labels, v in at25[ef.XID_COUNT]] == [("79", 2)]
    assert at25[Signal.XID][0][1] == 79  # the gauge cannot tell one XID 79 from two
    at35 = series(sim.render(t=35.0))
    assert sorted((labels[ef.XID_LABEL], v) for labels, v in at35[ef.XID_COUNT]) == [("13", 1), ("79", 2)]
    later = series(sim.render(t=10 + COUNT_WINDOW_MS / 1000 + 1))
    assert sorted((labels[ef.XID_LABEL], v) for labels, v in later[ef.XID_COUNT]) == [("13", 1), ("79", 1)]


def test_clock_events_count_counts_the_seconds_a_bit_was_seen_in_the_window() -> None:
    faults = (Fault(FaultKind.CLOCK_EVENTS, at=10, duration=5, node="n0", gpu=0, value=0x20),)
    sim = fleet(Generation.V4_9, faults=faults)
    for t in range(0, 20):
        text = sim.render(t=float(t))
    counted = {labels.get(ef.CLOCK_EVENT_LABEL, ""): v for labels, v in series(text)[ef.CLOCK_EVENTS_COUNT]}
    assert counted["sw_thermal"] == 5


def test_a_mixed_fleet_serves_each_node_in_its_generation_and_parses_as_one_exposition() -> None:
    sim = fleet(*SIMULATED)
    text = sim.render(t=5.0)
    parsed = series(text)  # the parser rejects a family split in two or a duplicate HELP
    assert set(by_node(text, Signal.GPU_UTIL.value)) == {"n0", "n1", "n2", "n4"}
    assert set(by_node(text, "DCGM_FI_DEV_GPU_UTIL_RATIO")) == {"n3"}
    assert set(by_node(text, ef.XID_COUNT)) == {"n2", "n3"}
    assert set(by_node(text, Signal.ECC_DBE_VOLATILE.value)) == {"n0", "n1", "n2", "n3"}
    assert len(parsed[ef.OLD_CLOCK_EVENTS]) == 1


def test_one_clock_events_name_for_every_node_still_overrides_the_generation() -> None:
    sim = fleet(Generation.V4_9, options=SimOptions(clock_events_metric=catalog.CLOCK_EVENTS_OLD))
    assert ef.OLD_CLOCK_EVENTS in series(sim.render(t=1.0))


SCENARIO = """
simulator: {exporter: "4.9+"}
nodes:
  - {prefix: old-, count: 2, exporter: legacy}
  - {name: new-0}
"""


def test_the_scenario_sets_a_default_and_per_node_generations() -> None:
    scenario = parse_scenario(SCENARIO).scenario
    assert scenario.simulator.exporter is Generation.V4_9
    assert [n.exporter for n in scenario.nodes] == [Generation.LEGACY, None]
    assert parse_scenario("nodes: [{name: a}]").scenario.simulator.exporter is Generation.V4


@pytest.mark.parametrize("bad", ["4.9", "unknown", "v4.9", "5.x"])
def test_a_bad_exporter_value_is_a_clear_error_naming_the_accepted_ones(bad: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(f"nodes: [{{name: a, exporter: {bad}}}]")
    message = str(e.value)
    assert "nodes[0].exporter (line 1): unknown exporter" in message
    assert "legacy, 4.x, 4.8.3+, 4.9+, default-csv" in message


def test_the_schema_lists_the_generations() -> None:
    defs = json_schema()["$defs"]
    exporter = defs["SimulatorOptions"]["properties"]["exporter"]
    assert exporter["enum"] == ["legacy", "4.x", "4.8.3+", "4.9+", "default-csv"]
