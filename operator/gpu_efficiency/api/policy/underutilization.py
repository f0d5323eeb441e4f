"""The thresholds of the underutilization diagnosis: GPUs that are busy on paper but do little work."""

from __future__ import annotations

from pydantic import Field

from gpu_efficiency.api.policy.base import Model


class UnderutilizationRule(Model):
    """Diagnosis of GPUs that are busy on paper but do little work. Thresholds are fractions 0-1."""

    enabled: bool = True
    """Diagnose underutilization and annotate pods with a diagnosis and a recommendation."""
    low_activity_below: float = Field(default=0.3, ge=0.0, le=1.0)
    """SM activity below this is low compute (the common condition of most diagnoses)."""
    fake_load_gpu_util_above: float = Field(default=0.8, ge=0.0, le=1.0)
    """GPU_UTIL at or above this with low SM activity is fake load."""
    memory_bound_dram_above: float = Field(default=0.8, ge=0.0, le=1.0)
    """DRAM activity above this with low SM activity is memory-bound."""
    input_starved_pcie_rx_bytes_per_second: float = Field(default=1.0e9, ge=0.0)
    """PCIe RX peak above this (bytes/s) with low SM activity and oscillating utilisation is input-starved."""
    oscillation_stddev_above: float = Field(default=0.15, ge=0.0, le=1.0)
    """Standard deviation of GPU_UTIL (0-1) above which utilisation counts as oscillating."""
    communication_bytes_per_second: float = Field(default=5.0e9, ge=0.0)
    """NVLink or network traffic above this (bytes/s) with low SM activity is communication-bound."""
    low_occupancy_sm_active_above: float = Field(default=0.5, ge=0.0, le=1.0)
    """SM activity above this with occupancy below lowOccupancyBelow is low occupancy (batch too small)."""
    low_occupancy_below: float = Field(default=0.2, ge=0.0, le=1.0)
    """SM occupancy below this (with high SM activity) is low occupancy."""
    no_tensor_sm_active_min: float = Field(default=0.3, ge=0.0, le=1.0)
    """Lower bound of SM activity for the no-tensor-cores diagnosis."""
    no_tensor_sm_active_max: float = Field(default=0.7, ge=0.0, le=1.0)
    """Upper bound of SM activity for the no-tensor-cores diagnosis."""
    no_tensor_tensor_below: float = Field(default=0.01, ge=0.0, le=1.0)
    """Tensor pipe activity below this counts as no tensor cores."""
    temperature_limit_celsius: float = Field(default=87.0, ge=0.0, le=150.0)
    """GPU temperature above this counts as thermal throttling for the diagnosis."""
    memory_pressure_fraction: float = Field(default=0.95, ge=0.0, le=1.0)
    """Framebuffer use at or above this fraction of the total is memory pressure."""
    efficient_sm_active_above: float = Field(default=0.5, ge=0.0, le=1.0)
    """SM activity at or above this with no other finding is compute-bound (efficient)."""
