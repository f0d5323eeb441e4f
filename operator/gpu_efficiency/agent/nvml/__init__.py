"""NVML behind a small interface: ``types`` (the Protocol), ``real`` (nvidia-ml-py) and ``fake`` (tests)."""

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
