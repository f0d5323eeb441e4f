"""The agent's real NVML path on a real GPU. Skipped, with the reason, where no driver answers.

Run on a GPU machine with ``pytest -m gpu tests/gpu -s``; set GPUEFF_NVML_REPORT=path.json to keep
what each GPU supported, and the GPM values idle and under load, for the issue note.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpu_efficiency.agent.collect import Collector, GpuReading
from gpu_efficiency.agent.fields import FIELDS
from gpu_efficiency.agent.nvml.real import PynvmlBackend
from gpu_efficiency.agent.nvml.types import DeviceInfo, NvmlError
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import AgentServer

GPM_KEYS = [f.key for f in FIELDS if f.probe.value == "gpm"]
REPORT: dict[str, Any] = {}


def _driver_or_reason() -> str | None:
    backend = PynvmlBackend()
    try:
        backend.init()
        count = len(backend.devices())
    except NvmlError as exc:
        smi = shutil.which("nvidia-smi")
        return f"no usable NVIDIA driver ({exc}); nvidia-smi {'at ' + smi if smi else 'not found'}"
    finally:
        backend.shutdown()
    return None if count else "NVML initialised but reports no GPU"


_REASON = _driver_or_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture(scope="module")
def nvml() -> Iterator[PynvmlBackend]:
    backend = PynvmlBackend()
    backend.init()
    yield backend
    backend.shutdown()
    path = os.environ.get("GPUEFF_NVML_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump(REPORT, fh, indent=2, sort_keys=True)


def _all_devices(nvml: PynvmlBackend) -> list[DeviceInfo]:
    devices: list[DeviceInfo] = []
    for gpu in nvml.devices():
        devices.append(gpu)
        try:
            devices.extend(nvml.mig_devices(gpu))
        except NvmlError as exc:
            if not exc.not_supported:  # only "no MIG here" is acceptable
                raise
    return devices


def _read(collector: Collector, device: DeviceInfo, seconds: float = 1.0) -> GpuReading:
    collector.read(device)  # GPM baseline
    time.sleep(seconds)
    return collector.read(device)


def test_every_field_is_read_or_reported_unsupported(nvml: PynvmlBackend) -> None:
    collector = Collector(nvml)
    REPORT["driver"] = nvml.driver_version()
    for device in _all_devices(nvml):
        reading = _read(collector, device)
        expected = {f.key for f in FIELDS if not device.is_mig or f.probe.value in ("memory", "gpm")}
        assert set(reading.values) | set(reading.failures) == expected  # each field: a value or a reason
        assert not set(reading.values) & set(reading.failures)
        v = reading.values
        if not device.is_mig:
            assert device.uuid.startswith("GPU-")
            assert 0 <= v.get("gpu_util", 0) <= 100
            assert 0 < v.get("gpu_temp_c", 40) < 120
        assert v["fb_total_mib"] > 0  # memory info works everywhere, MIG included
        assert v["fb_used_mib"] + v["fb_free_mib"] == pytest.approx(v["fb_total_mib"], rel=0.02)
        REPORT.setdefault("devices", {})[device.uuid] = {
            "name": device.name,
            "index": device.label_index,
            "values": dict(v),
            "unsupported": dict(reading.failures),
        }
        print(f"\n{device.label_index} {device.name} {device.uuid}")
        for key in sorted(expected):
            print(f"  {key:28} {v[key] if key in v else 'absent: ' + reading.failures[key]}")


def _is_hopper_or_newer(name: str) -> bool:
    return any(tag in name for tag in ("H100", "H200", "H800", "GH200", "B100", "B200", "GB200"))


def test_gpm_on_hopper(nvml: PynvmlBackend) -> None:
    gpus = [d for d in nvml.devices() if _is_hopper_or_newer(d.name)]
    if not gpus:
        pytest.skip("no Hopper or newer GPU: GPM is not expected")
    collector = Collector(nvml)
    for gpu in gpus:
        reading = _read(collector, gpu)
        for key in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_engine_active"):
            assert key in reading.values, reading.failures.get(key)
            assert 0.0 <= reading.values[key] <= 1.0
        REPORT.setdefault("gpm_idle", {})[gpu.uuid] = {k: reading.values.get(k) for k in GPM_KEYS}


_LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    b = a @ a
torch.cuda.synchronize()
"""


def test_gpm_under_a_matmul_load(nvml: PynvmlBackend) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch not installed: no load generator")
    gpu = nvml.devices()[0]
    if not _is_hopper_or_newer(gpu.name):
        pytest.skip("GPM needs Hopper or newer")
    load = subprocess.Popen([sys.executable, "-c", _LOAD, "8"])
    try:
        time.sleep(3)  # CUDA start-up
        reading = _read(Collector(nvml), gpu, seconds=2.0)
    finally:
        load.wait(timeout=60)
    REPORT.setdefault("gpm_load", {})[gpu.uuid] = {k: reading.values.get(k) for k in GPM_KEYS} | {
        "gpu_util": reading.values.get("gpu_util")
    }
    assert reading.values["sm_active"] > 0.5
    assert reading.values["tensor_active"] > 0.05  # fp16 matmul runs on tensor cores


def test_event_set_wait(nvml: PynvmlBackend) -> None:
    uuids = [d.uuid for d in nvml.devices()]
    failed = nvml.open_events(uuids)
    REPORT["events_unsupported"] = failed
    try:
        started = time.monotonic()
        event = nvml.wait_event(0.5)  # normally a timeout: no fault on a healthy GPU
        assert event is None or event.uuid in uuids
        assert time.monotonic() - started < 2.0
    finally:
        nvml.close_events()


def test_agent_serves_real_gpus() -> None:
    agent = Agent(PynvmlBackend(), AgentConfig(node_name="gpu-test", interval_s=0.5))
    server = AgentServer(agent, "127.0.0.1:0")
    server.start()
    agent.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        deadline = time.monotonic() + 10
        with httpx.Client() as http:
            while http.get(f"{url}/readyz").status_code != 200:
                assert time.monotonic() < deadline, http.get(f"{url}/readyz").text
                time.sleep(0.2)
            assert "DCGM_FI_DEV_GPU_UTIL{" in http.get(f"{url}/metrics").text
    finally:
        agent.stop()
        server.stop()
