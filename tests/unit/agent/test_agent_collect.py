"""Collector: every field through the fake NVML, unit conversions, unsupported fields, MIG."""

from __future__ import annotations

import logging

import pytest

from gpu_efficiency.agent.collect import Collector
from gpu_efficiency.agent.fields import FIELDS, MIG_PROBES, PROBE_FIELDS
from gpu_efficiency.agent.nvml.types import GpmMetrics, NvmlCode, Probe
from gpu_efficiency_sim.fake_nvml.backend import FakeBackend, FakeGpu

GPM = GpmMetrics(
    graphics_util=81.0,
    sm_util=64.0,
    sm_occupancy=32.0,
    any_tensor_util=12.5,
    dram_bw_util=40.0,
    pcie_rx_mib_s=100.0,
    pcie_tx_mib_s=50.0,
    nvlink_rx_mib_s=2048.0,
    nvlink_tx_mib_s=1024.0,
)
MIB = 1024 * 1024


def _gpu() -> FakeGpu:
    return FakeGpu(
        index=0,
        uuid="GPU-0",
        gpu_util=97.0,
        mem_util=33.0,
        fb_total_mib=81559.0,
        fb_used_mib=1559.0,
        power_w=312.5,
        power_limit_w=700.0,
        temp_c=61,
        memory_temp_c=66,
        slowdown_c=87,
        shutdown_c=92,
        clock_event_reasons=0x40 | 0x20,
        sm_clock_mhz=1410,
        pcie_gen=4,
        pcie_width=8,
        ecc_enabled=True,
        ecc_pending=False,
        ecc_dbe_volatile=2,
        ecc_dbe_aggregate=5,
        remapped_correctable=3,
        remapped_uncorrectable=1,
        remap_pending=True,
        remap_failure=False,
        retired_pending=True,
        gpm=GPM,
    )


def _read_twice(backend: FakeBackend, key: str = "GPU-0") -> dict[str, float]:
    collector = Collector(backend, clock=lambda: 1000.0)
    device = backend.gpu(key).info()
    collector.read(device)  # GPM needs a previous sample
    reading = collector.read(device)
    assert reading.timestamp == 1000.0
    assert reading.failures == {}
    return dict(reading.values)


def test_every_field_in_dcgm_units() -> None:
    backend = FakeBackend([_gpu()])
    backend.init()
    values = _read_twice(backend)
    assert values == pytest.approx(
        {
            "gpu_util": 97.0,
            "mem_copy_util": 33.0,
            "fb_used_mib": 1559.0,
            "fb_free_mib": 80000.0,
            "fb_total_mib": 81559.0,
            "power_w": 312.5,
            "power_limit_w": 700.0,
            "gpu_temp_c": 61,
            "memory_temp_c": 66,
            "slowdown_temp_c": 87,
            "shutdown_temp_c": 92,
            "clock_event_reasons": 0x60,
            "sm_clock_mhz": 1410,
            "pcie_link_gen": 4,
            "pcie_link_width": 8,
            "pcie_max_link_gen": 5,
            "pcie_max_link_width": 16,
            "ecc_enabled": 1.0,
            "ecc_pending_enabled": 0.0,
            "ecc_dbe_volatile": 2,
            "ecc_dbe_aggregate": 5,
            "remapped_rows_correctable": 3,
            "remapped_rows_uncorrectable": 1,
            "row_remap_pending": 1.0,
            "row_remap_failure": 0.0,
            "retired_pages_pending": 1.0,
            "gr_engine_active": 0.81,  # GPM percent -> dcgm ratio
            "sm_active": 0.64,
            "sm_occupancy": 0.32,
            "tensor_active": 0.125,
            "dram_active": 0.40,
            "pcie_rx_bytes": 100 * MIB,  # MiB/s -> bytes/s
            "pcie_tx_bytes": 50 * MIB,
            "nvlink_rx_bytes": 2048 * MIB,
            "nvlink_tx_bytes": 1024 * MIB,
        }
    )
    assert set(values) == {f.key for f in FIELDS}  # the table and the probes agree


def test_gpm_absent_on_first_sample_without_failure() -> None:
    backend = FakeBackend([_gpu()])
    backend.init()
    reading = Collector(backend).read(backend.gpu(0).info())
    assert "sm_active" not in reading.values
    assert "sm_active" not in reading.failures  # warming up is not a failure
    assert reading.values["gpu_util"] == 97.0


@pytest.mark.parametrize("probe", list(Probe))
def test_each_unsupported_probe_leaves_only_its_fields_absent(probe: Probe) -> None:
    backend = FakeBackend([_gpu()])
    backend.init()
    backend.fail(0, probe, NvmlCode.NOT_SUPPORTED)
    collector = Collector(backend)
    collector.read(backend.gpu(0).info())
    reading = collector.read(backend.gpu(0).info())
    missing = set(PROBE_FIELDS[probe])
    assert missing
    assert missing.isdisjoint(reading.values)
    assert reading.failures == dict.fromkeys(missing, "NVML_ERROR_NOT_SUPPORTED")
    assert set(reading.values) == {f.key for f in FIELDS} - missing


def test_unsupported_is_logged_once_per_gpu_and_probe(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend([_gpu(), FakeGpu(index=1, uuid="GPU-1")])
    backend.init()
    backend.fail(0, Probe.MEMORY_TEMPERATURE)
    backend.fail(1, Probe.MEMORY_TEMPERATURE)
    backend.fail(1, Probe.POWER, NvmlCode.GPU_IS_LOST)
    collector = Collector(backend)
    with caplog.at_level(logging.INFO, logger="gpu_efficiency.agent.collect"):
        for _ in range(5):
            for g in backend.gpus:
                collector.read(g.info())
    lines = [r for r in caplog.records if "failed with" in r.getMessage()]
    assert len(lines) == 3
    lost = next(r for r in lines if "GPU is lost" in r.getMessage() or "GPU_IS_LOST" in r.getMessage())
    assert lost.levelno == logging.WARNING  # a real error is louder than an unsupported field
    assert all(r.levelno == logging.INFO for r in lines if r is not lost)
    assert "memory_temp_c" in lines[0].getMessage()


def test_pre_hopper_gpu_reports_no_gpm_fields() -> None:
    backend = FakeBackend([FakeGpu(index=0, uuid="GPU-0", gpm=None)])
    backend.init()
    collector = Collector(backend)
    collector.read(backend.gpu(0).info())
    reading = collector.read(backend.gpu(0).info())
    assert "sm_active" not in reading.values
    assert reading.failures["sm_active"] == "NVML_ERROR_NOT_SUPPORTED"
    assert reading.values["gpu_util"] == 0.0


def test_one_gpm_metric_missing_is_reported_alone() -> None:
    gpu = _gpu()
    gpu.gpm = GpmMetrics(graphics_util=50.0, sm_util=40.0)  # the rest not reported
    backend = FakeBackend([gpu])
    backend.init()
    collector = Collector(backend)
    collector.read(gpu.info())
    reading = collector.read(gpu.info())
    assert reading.values["sm_active"] == pytest.approx(0.4)
    assert reading.failures["nvlink_rx_bytes"] == "NVML_GPM_METRIC_UNAVAILABLE"
    assert "sm_active" not in reading.failures


def test_mig_device_reads_only_mig_probes() -> None:
    parent = _gpu()
    child = FakeGpu(
        index=0,
        uuid="MIG-1",
        parent_uuid="GPU-0",
        gpu_instance_id=3,
        mig_profile="1g.10gb",
        fb_total_mib=9984.0,
        fb_used_mib=984.0,
        gpm=GpmMetrics(sm_util=10.0),
    )
    parent.mig = [child]
    backend = FakeBackend([parent])
    backend.init()
    (info,) = backend.mig_devices(parent.info())
    assert info.is_mig
    assert info.label_index == "0/3"
    collector = Collector(backend)
    collector.read(info)
    before = backend.calls
    reading = collector.read(info)
    assert backend.calls - before == len(MIG_PROBES)
    assert reading.values["fb_used_mib"] == 984.0
    assert reading.values["sm_active"] == pytest.approx(0.1)
    assert "gpu_temp_c" not in reading.values
    assert "gpu_temp_c" not in reading.failures
