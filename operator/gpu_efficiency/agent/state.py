"""One GPU as the outputs see it: the latest reading, its fault events and the pods using it."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_efficiency.agent.collect import GpuReading
from gpu_efficiency.agent.faults import GpuFaults
from gpu_efficiency.agent.fields import BY_KEY, XID_METRIC
from gpu_efficiency.agent.pods import PodAttribution

_DBE_KEY = "ecc_dbe_volatile"


@dataclass(frozen=True, slots=True)
class GpuView:
    reading: GpuReading
    faults: GpuFaults
    pods: tuple[PodAttribution, ...]

    def metric_values(self) -> dict[str, float]:
        """dcgm-exporter name -> value, as ``/metrics`` serves it and the history stores it.

        XID is the event thread's last XID (NVML cannot be polled for it). Where the ECC counter cannot be
        read, the DBE events seen stand in for it, so a double-bit error still shows as an increase.
        """
        out = {BY_KEY[key].metric: value for key, value in self.reading.values.items()}
        if self.reading.device.is_mig:  # faults belong to the parent GPU
            return out
        out[XID_METRIC] = float(self.faults.last_xid)
        if _DBE_KEY not in self.reading.values and self.faults.dbe_events:
            out[BY_KEY[_DBE_KEY].metric] = float(self.faults.dbe_events)
        return out
