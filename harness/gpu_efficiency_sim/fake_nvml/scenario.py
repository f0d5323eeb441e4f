"""Fake-backend scenarios: named workload profiles and a small YAML of GPUs, faults and changes over time.

Used by ``gpu-efficiency-sim agent`` (the e2e hook) and the benchmark::

    gpus:                        # or a count: "gpus: 8"
      - profile: compute-bound   # a profiles.PROFILES name (default idle), its one-minute mean
        model: NVIDIA H100 80GB HBM3 # a gpu_models.MODELS name or product (default the first)
        uuid: GPU-...            # default: stable per node name and index (see fake_uuid)
        pods: [ml/train-0/worker]  # namespace/pod[/container]
        values: {temp_c: 70}     # any FakeGpu field
        unsupported: [memory_temperature]  # probes answering NVML_ERROR_NOT_SUPPORTED
        gpm: false               # no GPM (a pre-Hopper model has none anyway)
        mig: [1g.10gb, 1g.10gb]  # MIG devices (profile names)
    timeline:                    # seconds after NVML init
      - {at: 30s, gpu: 0, profile: idle}
      - {at: 60s, gpu: all, values: {temp_c: 95, clock_event_reasons: 0x40}}
      - {at: 90s, gpu: 1, event: xid, xid: 79}
      - {at: 95s, gpu: 2, event: dbe}
      - {at: 99s, gpu: 3, unsupported: [power], supported: [memory_temperature]}
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpu_efficiency.agent.nvml.types import EventKind, GpmMetrics, NvmlCode, Probe
from gpu_efficiency.agent.pods import PodAttribution, parse_static
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.engine.model import Signal
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.fake_nvml.backend import MIB, FakeBackend, FakeGpu, TimedStep, fake_gpu, fake_uuid
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL, GPUModel, find_model
from gpu_efficiency_sim.profiles import PROFILES, sample

log = logging.getLogger(__name__)

#: Seconds of a profile the fake's static values average: a minute, an activity window's length.
PROFILE_SECONDS = 60


@functools.cache
def _profile_values(name: str, model: GPUModel, seed: int) -> tuple[tuple[str, Any], ...]:
    means: dict[str, float] = {}
    events = 0
    for t in range(PROFILE_SECONDS):
        reading = sample(name, float(t), seed, model)
        events |= int(reading[catalog.CLOCK_EVENTS_NEW])
        for key, value in reading.items():
            means[key] = means.get(key, 0.0) + value / PROFILE_SECONDS

    def percent(signal: str) -> float:
        return round(100.0 * means[signal], 3)

    def mib_s(signal: str) -> float:
        return round(means[signal] / MIB, 3)

    return (
        ("gpu_util", round(means[Signal.GPU_UTIL], 3)),
        ("mem_util", round(means[catalog.MEM_COPY_UTIL], 3)),
        ("fb_used_mib", round(means[Signal.FB_USED])),
        ("power_w", round(means[Signal.POWER], 3)),
        ("temp_c", round(means[Signal.GPU_TEMP])),
        ("memory_temp_c", round(means[Signal.MEMORY_TEMP])),
        ("clock_event_reasons", events),
        (
            "gpm",
            GpmMetrics(
                graphics_util=percent(Signal.GR_ENGINE_ACTIVE),
                sm_util=percent(Signal.SM_ACTIVE),
                sm_occupancy=percent(Signal.SM_OCCUPANCY),
                any_tensor_util=percent(Signal.TENSOR_ACTIVE),
                dram_bw_util=percent(Signal.DRAM_ACTIVE),
                pcie_rx_mib_s=mib_s(Signal.PCIE_RX_BYTES),
                pcie_tx_mib_s=mib_s(Signal.PCIE_TX_BYTES),
                nvlink_rx_mib_s=mib_s(Signal.NVLINK_RX_BYTES),
                nvlink_tx_mib_s=mib_s(Signal.NVLINK_TX_BYTES),
            ),
        ),
    )


def profile_values(name: str, model: GPUModel = DEFAULT_MODEL, seed: int = 0) -> dict[str, Any]:
    """``FakeGpu`` fields, in NVML units, of a GPU of ``model`` playing the simulator's profile ``name``
    (``profiles.PROFILES``, the one table of workload profiles): the mean of its readings over
    ``PROFILE_SECONDS``, and every clock event reason it shows in them. Static, so a timeline step
    changes it, not time."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return dict(_profile_values(name, model, seed))


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) else parse_duration(str(value))


def _apply(gpu: FakeGpu, spec: Mapping[str, Any]) -> None:
    """Profile, values and (un)supported probes of one GPU or timeline step."""
    if "profile" in spec:
        for name, value in profile_values(spec["profile"], find_model(gpu.name), gpu.index).items():
            if name != "gpm" or gpu.gpm is not None:  # a GPU without GPM keeps none
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


def inbox_poller(directory: Path) -> Callable[[FakeBackend], None]:
    """Apply each ``*.json`` file dropped into ``directory`` once, as a timeline step due now (e.g.
    ``{"gpu": 3, "event": "xid", "xid": 48}``), oldest name first, then delete it: how a benchmark
    or test in another process injects an NVML event at a moment it knows (write to a temporary
    name, then rename into place). A file that is not such a step is renamed ``*.rejected``."""

    busy = threading.Lock()  # the sampler and the event thread both tick: one of them reads a file

    def poll(backend: FakeBackend) -> None:
        if not busy.acquire(blocking=False):
            return
        try:
            _drain(backend)
        finally:
            busy.release()

    def _drain(backend: FakeBackend) -> None:
        try:
            names = sorted(p for p in os.listdir(directory) if p.endswith(".json"))
        except FileNotFoundError:
            return
        for name in names:
            path = directory / name
            try:
                spec = json.loads(path.read_text())
                if not isinstance(spec, dict):
                    raise ValueError("not a JSON object")
                _step(0.0, spec).apply(backend)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("fake NVML inbox: %s rejected: %s", name, exc)
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".rejected"))
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    return poll


def build_fake(
    node: str,
    *,
    scenario: str | Path | None = None,
    gpus: int = 0,
    profile: str = "idle",
    pods: str = "",
    clock: Callable[[], float] = time.monotonic,
    inbox: Path | None = None,
) -> tuple[FakeBackend, dict[str, tuple[PodAttribution, ...]]]:
    """The fake backend and its static pod attribution, from a scenario file or ``gpus`` x ``profile``;
    ``inbox``: a directory polled for steps to apply at once (``inbox_poller``)."""
    doc: dict[str, Any] = {}
    if scenario is not None:
        doc = yaml.safe_load(Path(scenario).read_text()) or {}
    specs = doc.get("gpus", gpus)
    if isinstance(specs, int):
        specs = [{"profile": profile} for _ in range(specs)]
    fakes: list[FakeGpu] = []
    attribution: dict[str, tuple[PodAttribution, ...]] = {}
    for index, spec in enumerate(specs):
        model = find_model(spec["model"]) if "model" in spec else DEFAULT_MODEL
        g = fake_gpu(model, index, spec.get("uuid") or fake_uuid(node, index))
        _apply(g, {"profile": profile} | spec)
        g.mig = _mig_children(g, list(spec.get("mig") or ()))
        fakes.append(g)
        listed = ",".join(f"{ref}={g.uuid}" for ref in spec.get("pods") or ())
        attribution.update(parse_static(listed))
    for device, found in parse_static(pods).items():
        key = fakes[int(device)].uuid if device.isdigit() and int(device) < len(fakes) else device
        attribution[key] = attribution.get(key, ()) + found
    steps = [_step(_seconds(s["at"]), s) for s in doc.get("timeline") or ()]
    pollers = [inbox_poller(inbox)] if inbox is not None else []
    return FakeBackend(fakes, steps=steps, clock=clock, pollers=pollers), attribution
