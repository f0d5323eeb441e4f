"""Straggler detection: the GPU of a multi-GPU job that runs markedly slower than its peers."""

from __future__ import annotations

from pydantic import Field

from gpu_efficiency.api.policy.base import Duration, Model


class StragglerRule(Model):
    """Stragglers: the GPU of a multi-GPU job that runs markedly slower than its peers.

    A synchronous job runs at the speed of its slowest GPU. Each GPU's SM activity, tensor activity,
    SM clock and power are compared with its job group's median, robustly (median and median
    absolute deviation, so one slow GPU cannot hide itself by widening the spread).
    """

    enabled: bool = False
    """Judge job groups for stragglers at all (off by default)."""
    group_by: list[str] = Field(default_factory=list, max_length=16)
    """Pod label keys that also name a job group (tried before the well-known job labels and owners)."""
    min_gpus: int = Field(default=4, ge=3, le=100000)
    """Groups with fewer GPUs are not judged (a median of two says nothing about which one is slow)."""
    mad_factor: float = Field(default=3.0, ge=1.0, le=100.0)
    """How many scaled median absolute deviations (MAD x 1.4826) below the median a GPU must be."""
    min_shortfall: float = Field(default=0.1, ge=0.01, le=0.9)
    """And how far below the median, as a fraction of it (0.1: 10 % slower). Both must hold."""
    busy_above: float = Field(default=0.3, ge=0.0, le=1.0)
    """A group whose median SM activity is below this is idle or warming up and is not judged."""
    for_duration: Duration = Duration("5m")
    """How long a GPU must stay a straggler before it is reported."""
    quarantine_hardware: bool = False
    """Hold the node of a hardware straggler (thermal, power, clock or PCIe link cause) as the straggler fault: GPUDegraded=True and its events (in Observe mode too), and in Enforce mode the taint gpuefficiency.io/gpu-fault=straggler:PreferNoSchedule under the faults circuit breaker; released once its group shows the GPU back at speed, at least forDuration after detection."""
