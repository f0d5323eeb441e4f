"""Fake-backend scenarios: named workload profiles and a small YAML of GPUs, faults and changes over time.

Used by ``gpu-efficiency-sim agent`` (the e2e hook) and the benchmark::

    gpus:                        # or a count: "gpus: 8"
      - profile: compute-bound   # a PROFILES name (default idle)
        model: NVIDIA H100 80GB HBM3
        uuid: GPU-...            # default: stable per node name and index (see fake_uuid)
        pods: [ml/train-0/worker]  # namespace/pod[/container]
        values: {temp_c: 70}     # any FakeGpu field
        unsupported: [memory_temperature]  # probes answering NVML_ERROR_NOT_SUPPORTED
        gpm: false               # a pre-Hopper GPU
        mig: [1g.10gb, 1g.10gb]  # MIG devices (profile names)
    timeline:                    # seconds after NVML init
      - {at: 30s, gpu: 0, profile: idle}
      - {at: 60s, gpu: all, values: {temp_c: 95, clock_event_reasons: 0x40}}
      - {at: 90s, gpu: 1, event: xid, xid: 79}
      - {at: 95s, gpu: 2, event: dbe}
      - {at: 99s, gpu: 3, unsupported: [power], supported: [memory_temperature]}
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_efficiency.agent.nvml.types import EventKind, GpmMetrics, NvmlCode, Probe
from gpu_efficiency.agent.pods import PodAttribution, parse_static
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency_sim.fake_nvml.backend import DEFAULT_MODEL, FakeBackend, FakeGpu, TimedStep, fake_uuid

# NVML clock event reason bits
GPU_IDLE = 0x1
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40


@dataclass(frozen=True, slots=True)
class Profile:
    """A workload's signature in NVML units: utilization and GPM percentages, MiB/s, W, C, MiB."""

    gpu_util: float
    sm: float
    occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    pcie_rx: float = 5.0
    pcie_tx: float = 2.0
    nvlink: float = 0.0
    fb_used_mib: float = 0.0
    power_w: float = 70.0
    temp_c: int = 32
    clock_event_reasons: int = 0

    def values(self) -> dict[str, Any]:
        return {
            "gpu_util": self.gpu_util,
            "mem_util": self.dram,
            "fb_used_mib": self.fb_used_mib,
            "power_w": self.power_w,
            "temp_c": self.temp_c,
            "memory_temp_c": self.temp_c + 4,
            "clock_event_reasons": self.clock_event_reasons,
            "gpm": GpmMetrics(
                graphics_util=max(self.sm, min(100.0, self.gpu_util)),
                sm_util=self.sm,
                sm_occupancy=self.occupancy,
                any_tensor_util=self.tensor,
                dram_bw_util=self.dram,
                pcie_rx_mib_s=self.pcie_rx,
                pcie_tx_mib_s=self.pcie_tx,
                nvlink_rx_mib_s=self.nvlink,
                nvlink_tx_mib_s=self.nvlink,
            ),
        }


PROFILES: Mapping[str, Profile] = {
    "idle": Profile(0, 0, clock_event_reasons=GPU_IDLE),
    "idle-holding-memory": Profile(0, 0, fb_used_mib=60000, power_w=80, clock_event_reasons=GPU_IDLE),
    "compute-bound": Profile(98, 92, 55, 60, 45, 500, 100, 0, 62000, 640, 68),
    "memory-bound": Profile(96, 24, 18, 5, 88, 300, 50, 0, 70000, 450, 63),
    "input-starved": Profile(45, 14, 10, 8, 10, 9000, 40, 0, 30000, 190, 50),
    "communication-bound": Profile(72, 18, 12, 10, 20, 200, 200, 120000, 50000, 300, 55),
    "low-occupancy": Profile(95, 85, 9, 25, 30, 300, 50, 0, 20000, 420, 60),
    "no-tensor-cores": Profile(95, 55, 40, 0, 35, 300, 50, 0, 40000, 380, 60),
    "fake-load": Profile(100, 4, 2, 0, 1, 5, 2, 0, 2000, 110, 40),
    "bursty-inference": Profile(35, 22, 15, 20, 15, 800, 300, 0, 24000, 220, 48),
    "thermal-throttled": Profile(
        98, 70, 45, 50, 40, 300, 50, 0, 62000, 500, 93, SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
    ),
}


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) else parse_duration(str(value))


def _profile(name: str) -> dict[str, Any]:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name].values()


def _apply(gpu: FakeGpu, spec: Mapping[str, Any]) -> None:
    """Profile, values and (un)supported probes of one GPU or timeline step."""
    for name, value in (_profile(spec["profile"]) if "profile" in spec else {}).items():
        setattr(gpu, name, value)
    for name, value in (spec.get("values") or {}).items():
        if not hasattr(gpu, name) or name in ("uuid", "index", "mig", "errors"):
            raise ValueError(f"unknown or fixed FakeGpu field {name!r}")
        setattr(gpu, name, value)
    if spec.get("gpm") is False:
        gpu.gpm = None
    for probe in spec.get("unsupported") or ():
        gpu.errors[str(Probe(probe))] = NvmlCode.NOT_SUPPORTED
    for probe in spec.get("supported") or ():
        gpu.errors.pop(str(Probe(probe)), None)


def _mig_children(parent: FakeGpu, profiles: list[str]) -> list[FakeGpu]:
    children = []
    for gi, name in enumerate(profiles, start=1):
        child = FakeGpu(
            index=parent.index,
            uuid="MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{parent.uuid}/{gi}")),
            name=f"{parent.name} MIG {name}",
            pci_bus_id=parent.pci_bus_id,
            parent_uuid=parent.uuid,
            gpu_instance_id=gi,
            mig_profile=name,
            fb_total_mib=parent.fb_total_mib / max(1, len(profiles)),
        )
        children.append(child)
    return children


def _step(at: float, spec: Mapping[str, Any]) -> TimedStep:
    target = spec.get("gpu", "all")

    def apply(backend: FakeBackend) -> None:
        gpus = backend.gpus if target == "all" else [backend.gpu(target)]
        for g in gpus:
            _apply(g, spec)
            if "event" in spec:
                backend.inject(g.uuid, EventKind(spec["event"]), int(spec.get("xid", 0)))

    return TimedStep(at, apply)


def build_fake(
    node: str,
    *,
    scenario: str | Path | None = None,
    gpus: int = 0,
    profile: str = "idle",
    pods: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> tuple[FakeBackend, dict[str, tuple[PodAttribution, ...]]]:
    """The fake backend and its static pod attribution, from a scenario file or ``gpus`` x ``profile``."""
    doc: dict[str, Any] = {}
    if scenario is not None:
        doc = yaml.safe_load(Path(scenario).read_text()) or {}
    specs = doc.get("gpus", gpus)
    if isinstance(specs, int):
        specs = [{"profile": profile} for _ in range(specs)]
    fakes: list[FakeGpu] = []
    attribution: dict[str, tuple[PodAttribution, ...]] = {}
    for index, spec in enumerate(specs):
        g = FakeGpu(
            index=index,
            uuid=spec.get("uuid") or fake_uuid(node, index),
            name=spec.get("model", DEFAULT_MODEL),
        )
        _apply(g, {"profile": profile} | spec)
        g.mig = _mig_children(g, list(spec.get("mig") or ()))
        fakes.append(g)
        listed = ",".join(f"{ref}={g.uuid}" for ref in spec.get("pods") or ())
        attribution.update(parse_static(listed))
    for device, found in parse_static(pods).items():
        key = fakes[int(device)].uuid if device.isdigit() and int(device) < len(fakes) else device
        attribution[key] = attribution.get(key, ()) + found
    steps = [_step(_seconds(s["at"]), s) for s in doc.get("timeline") or ()]
    return FakeBackend(fakes, steps=steps, clock=clock), attribution
