"""Fault injections take effect at their time, on their GPUs, for their duration."""

from __future__ import annotations

import math

from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.faults import Fault, FaultKind
from tests.unit.sim.helpers import simulator


def value(sim_faults: tuple[Fault, ...], t: float, metric: str, node: str = "node-0", gpu: int = 0) -> object:
    sim, _ = simulator(nodes=2, gpus=2, faults=sim_faults)
    values = sim.gpu_values(node, gpu, t)
    return None if values is None else values.get(metric)


def test_ecc_double_bit_errors_add_up_at_their_times_and_stay() -> None:
    faults = (
        Fault(FaultKind.ECC, at=10.0, node="node-0", gpu=1, value=2),
        Fault(FaultKind.ECC, at=20.0, node="node-0", gpu=1, value=1, duration=1.0),
    )
    dbe = str(Signal.ECC_DBE_VOLATILE)
    assert value(faults, 9.9, dbe, gpu=1) == 0
    assert value(faults, 10.0, dbe, gpu=1) == 2
    assert value(faults, 25.0, dbe, gpu=1) == 3, "a counter stays raised after the fault's duration"
    assert value(faults, 25.0, dbe, gpu=0) == 0
    assert value(faults, 25.0, dbe, node="node-1", gpu=1) == 0


def test_counter_reset_drops_counters_and_later_errors_count_from_zero() -> None:
    faults = (
        Fault(FaultKind.ECC, at=5.0, node="node-0", value=4),
        Fault(FaultKind.GARBAGE, at=10.0, node="node-0", value="counter-reset"),
        Fault(FaultKind.ECC, at=15.0, node="node-0", value=1),
    )
    dbe = str(Signal.ECC_DBE_VOLATILE)
    assert [value(faults, t, dbe) for t in (6.0, 11.0, 16.0)] == [4, 0, 1]
    sim, _ = simulator(faults=faults)
    energy = [sim.gpu_values("node-0", 0, float(t))[catalog.ENERGY] for t in range(8, 14)]  # type: ignore[index]
    assert energy[3] < energy[1], "the energy counter resets too"


def test_xid_gauge_holds_the_code_then_clears_after_the_duration() -> None:
    faults = (Fault(FaultKind.XID, at=10.0, node="node-0", gpu=0, value=79, duration=5.0),)
    assert [value(faults, t, Signal.XID) for t in (9.0, 10.0, 14.9, 15.0)] == [0, 79, 79, 0]
    forever = (Fault(FaultKind.XID, at=1.0, node="node-0", value=48),)
    assert value(forever, 1000.0, Signal.XID, gpu=1) == 48


def test_temperature_and_clock_event_bits() -> None:
    faults = (
        Fault(FaultKind.TEMPERATURE, at=5.0, node="node-0", gpu=0, value=96, duration=10.0),
        Fault(FaultKind.CLOCK_EVENTS, at=5.0, node="node-0", gpu=0, value=0x60, duration=10.0),
    )
    assert value(faults, 6.0, Signal.GPU_TEMP) == 96
    assert value(faults, 6.0, Signal.MEMORY_TEMP) == 100
    assert int(value(faults, 6.0, catalog.CLOCK_EVENTS_NEW)) & 0x60 == 0x60  # type: ignore[call-overload]
    assert int(value(faults, 6.0, catalog.CLOCK_EVENTS_NEW)) & catalog.ClockEvent.GPU_IDLE  # type: ignore[call-overload]
    assert int(value(faults, 16.0, catalog.CLOCK_EVENTS_NEW)) & 0x60 == 0  # type: ignore[call-overload]
    assert value(faults, 16.0, Signal.GPU_TEMP) < 50  # type: ignore[operator]


def test_gap_removes_a_gpus_series_or_one_metric_for_its_duration() -> None:
    whole = (Fault(FaultKind.GAP, at=5.0, node="node-0", gpu=1, duration=10.0),)
    sim, _ = simulator(nodes=1, gpus=2, faults=whole)
    assert sim.gpu_values("node-0", 1, 6.0) is None
    assert sim.gpu_values("node-0", 0, 6.0) is not None
    assert sim.gpu_values("node-0", 1, 15.0) is not None
    text = sim.render(t=6.0)
    assert 'gpu="1"' not in text
    assert 'gpu="0"' in text
    one = (Fault(FaultKind.GAP, at=0.0, node="node-0", metric=str(Signal.SM_ACTIVE)),)
    sim, _ = simulator(gpus=1, faults=one)
    values = sim.gpu_values("node-0", 0, 1.0)
    assert values is not None
    assert Signal.SM_ACTIVE not in values
    assert Signal.GPU_UTIL in values


def test_a_node_wide_gap_without_a_node_hits_every_node() -> None:
    sim, _ = simulator(nodes=2, gpus=1, faults=(Fault(FaultKind.GAP, at=0.0, duration=5.0),))
    assert sim.render(t=1.0) == ""
    assert sim.render(t=6.0) != ""


def test_garbage_nan_negative_and_inf() -> None:
    nan = (Fault(FaultKind.GARBAGE, at=0.0, node="node-0", value="nan"),)
    values = simulator(faults=nan)[0].gpu_values("node-0", 0, 1.0)
    assert values is not None
    for metric in catalog.ACTIVITY_METRICS:
        assert values[metric] == "NaN"
    negative = (Fault(FaultKind.GARBAGE, at=0.0, node="node-0", value="negative"),)
    assert float(value(negative, 1.0, Signal.ECC_DBE_VOLATILE)) < 0  # type: ignore[arg-type]
    inf = (Fault(FaultKind.GARBAGE, at=0.0, node="node-0", value="inf", metric=str(Signal.POWER)),)
    assert value(inf, 1.0, Signal.POWER) == "+Inf"
    assert not math.isnan(float(value(inf, 1.0, Signal.SM_ACTIVE)))  # type: ignore[arg-type]


def test_remapped_rows_and_row_remap_failure() -> None:
    faults = (
        Fault(FaultKind.REMAPPED_ROWS, at=3.0, node="node-0", gpu=0, value=2),
        Fault(FaultKind.ROW_REMAP_FAILURE, at=4.0, node="node-0", gpu=0),
    )
    assert value(faults, 3.5, Signal.REMAPPED_ROWS_UNCORRECTABLE) == 2
    assert value(faults, 3.5, Signal.ROW_REMAP_FAILURE) == 0
    assert value(faults, 4.5, Signal.ROW_REMAP_FAILURE) == 1


def test_exporter_down_window() -> None:
    sim, _ = simulator(faults=(Fault(FaultKind.EXPORTER_DOWN, at=10.0, duration=5.0, value="503"),))
    assert sim.down(9.0) is None
    assert sim.down(10.0) is not None
    assert sim.down(14.0) is not None
    assert sim.down(15.0) is None


def test_faults_added_while_running_take_effect_from_their_time_and_keep_the_others() -> None:
    scheduled = (Fault(FaultKind.ECC, at=5.0, node="node-0", gpu=0, value=2),)
    sim, clock = simulator(nodes=2, gpus=2, faults=scheduled)
    dbe = str(Signal.ECC_DBE_VOLATILE)
    clock.at(30.0, sim)
    sim.add_faults([Fault(FaultKind.ECC, at=sim.elapsed(), node="node-0", gpu=0, value=1)])
    sim.add_faults([Fault(FaultKind.ECC, at=20.0, node="node-1", gpu=1)])  # in the past: counted since 20
    assert [sim.gpu_values("node-0", 0, t)[dbe] for t in (4.0, 6.0, 29.9, 30.0)] == [0, 2, 2, 3]  # type: ignore[index]
    assert [sim.gpu_values("node-1", 1, t)[dbe] for t in (19.9, 20.0)] == [0, 1]  # type: ignore[index]
    assert sim.gpu_values("node-1", 0, 30.0)[dbe] == 0  # type: ignore[index]
    line = next(
        x
        for x in sim.render().splitlines()
        if x.startswith(dbe + "{") and 'Hostname="node-0"' in x and 'gpu="0"' in x
    )
    assert line.endswith(" 3"), "the next render serves the injected value"


def test_exporter_down_added_while_running() -> None:
    sim, clock = simulator()
    clock.at(10.0, sim)
    assert sim.down() is None
    fault = Fault(FaultKind.EXPORTER_DOWN, at=sim.elapsed(), duration=5.0, value="503")
    sim.add_faults([fault])
    assert sim.down() is fault
    clock.at(15.0, sim)
    assert sim.down() is None


def test_slowdown_scales_one_gpus_sm_clock_and_power_for_its_duration() -> None:
    faults = (Fault(FaultKind.SLOWDOWN, at=5.0, node="node-0", gpu=0, value=0.5, duration=10.0),)
    for metric in (catalog.SM_CLOCK, str(Signal.POWER)):
        before, during = value((), 6.0, metric), value(faults, 6.0, metric)
        assert during == round(before * 0.5, 3)  # type: ignore[operator]
        assert value(faults, 6.0, metric, gpu=1) == value((), 6.0, metric, gpu=1)
        assert value(faults, 15.0, metric) == value((), 15.0, metric)


def test_pcie_link_caps_one_gpus_link_for_its_duration_and_an_idle_gpu_sits_at_gen1() -> None:
    gen, width = str(Signal.PCIE_LINK_GEN), str(Signal.PCIE_LINK_WIDTH)
    max_gen, max_width = str(Signal.PCIE_MAX_LINK_GEN), str(Signal.PCIE_MAX_LINK_WIDTH)
    assert [value((), 6.0, m) for m in (gen, width, max_gen, max_width)] == [1, 16, 5, 16]  # idle H100
    narrow = (Fault(FaultKind.PCIE_LINK, at=5.0, node="node-0", gpu=0, value="x8", duration=10.0),)
    assert value(narrow, 6.0, width) == 8
    assert value(narrow, 6.0, max_width) == 16
    assert value(narrow, 6.0, width, gpu=1) == 16
    assert value(narrow, 15.0, width) == 16
    both = (Fault(FaultKind.PCIE_LINK, at=0.0, node="node-0", gpu=0, value="gen3x4"),)
    assert (value(both, 6.0, gen), value(both, 6.0, width)) == (1, 4)  # idle: Gen1 is below Gen3 already
