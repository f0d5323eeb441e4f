"""NVML behind a small interface: ``types`` (the Protocol) and ``real`` (nvidia-ml-py); the fake for
tests lives in the harness (``gpu_efficiency_sim.fake_nvml``)."""

from gpu_efficiency.agent.nvml.types import (
    DeviceInfo,
    EccCounter,
    EccMode,
    EventKind,
    GpmMetrics,
    Memory,
    NvmlBackend,
    NvmlCode,
    NvmlError,
    NvmlEvent,
    Probe,
    RemappedRows,
    Threshold,
    Utilization,
)

__all__ = [
    "DeviceInfo",
    "EccCounter",
    "EccMode",
    "EventKind",
    "GpmMetrics",
    "Memory",
    "NvmlBackend",
    "NvmlCode",
    "NvmlError",
    "NvmlEvent",
    "Probe",
    "RemappedRows",
    "Threshold",
    "Utilization",
]
