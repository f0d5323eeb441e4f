"""GPU fault quarantine: the rule per fault kind (ECC, XID, thermal, PCIe), the circuit breaker and
single-GPU quarantine.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from gpu_efficiency.api.policy.base import Duration, Model


class FaultEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Recovery(StrEnum):
    AUTOMATIC = "Automatic"
    MANUAL = "Manual"


class FaultKindBase(Model):
    enabled: bool = True
    """Detect this fault kind."""
    effect: FaultEffect = FaultEffect.NO_SCHEDULE
    """Taint effect on a faulty node (Enforce mode only); NoExecute drains the node first (see drainTimeout)."""


class EccFault(FaultKindBase):
    """ECC faults: volatile double-bit errors increasing, uncorrectable remapped rows, row-remap failure, retired pages pending."""

    recovery: Recovery = Recovery.MANUAL
    """Manual by default: an admin annotates the node gpuefficiency.io/fault-recovered=ecc after replacing or resetting the GPU."""
    recovery_after: Duration = Duration("30m")
    """With Automatic recovery, how long the signals must be healthy before the taint is removed."""


#: XID codes that production GPU health systems treat as fatal.
DEFAULT_CRITICAL_XIDS = (48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 110, 119, 120, 136, 140, 143)
"""The node agent's default for its GPUHealthy condition (``--critical-xids``); policies choose by class."""
#: XID codes that are application errors, not hardware faults.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68)


class XidResolution(StrEnum):
    """What NVIDIA's XID catalog recommends for an XID (its resolution bucket, immediate action)."""

    IGNORE = "ignore"
    RESTART_APP = "restart-app"
    RESET_GPU = "reset-gpu"
    REBOOT_NODE = "reboot-node"
    CONTACT_SUPPORT = "contact-support"
    CHECK_HARDWARE = "check-hardware"
    UPDATE_SOFTWARE = "update-software"
    INVESTIGATE = "investigate"
    UNKNOWN = "unknown"


#: Classes that taint by default: the GPU itself needs a reset, a reboot or NVIDIA support.
DEFAULT_TAINT_CLASSES = (XidResolution.RESET_GPU, XidResolution.REBOOT_NODE, XidResolution.CONTACT_SUPPORT)


class XidRepeat(Model):
    """XID codes that matter only when they repeat on one GPU."""

    codes: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=256)
    """XID codes this rule covers."""
    count: int = Field(ge=2, le=1000)
    """Occurrences on one GPU within `within` before the XID taints."""
    within: Duration = Duration("1h")
    """The window the occurrences are counted in."""


class XidFault(FaultKindBase):
    """XID errors reported by the driver. The dcgm-exporter gauge holds the last XID, so a change counts.

    Whether an XID taints: codes in `ignored` never do; codes in `critical` always do; any other code
    does when its class in the operator's XID catalogue (written from NVIDIA's XID catalog) is one of
    `taintClasses`. A code covered by `repeat` then taints only once it repeats often enough.
    """

    taint_classes: list[XidResolution] = Field(
        default_factory=lambda: list(DEFAULT_TAINT_CLASSES), max_length=16
    )
    """Resolution classes whose XIDs taint (ignore, restart-app, reset-gpu, reboot-node, contact-support, check-hardware, update-software, investigate, unknown for codes not in the catalogue)."""
    critical: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=512)
    """XID codes that taint whatever their class (an override of the catalogue)."""
    ignored: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=512)
    """XID codes never acted upon whatever their class; wins over critical."""
    repeat: list[XidRepeat] = Field(default_factory=list, max_length=64)
    """Codes that taint only past a count of occurrences on one GPU within a window."""
    incident_nodes: int = Field(default=3, ge=2, le=100000)
    """Application-class XIDs (restart-app or ignore) newly seen on at least this many nodes in one cycle are reported as one incident (one policy event) and never taint."""
    recovery: Recovery = Recovery.MANUAL
    """Manual by default: annotate the node gpuefficiency.io/fault-recovered=xid."""
    recovery_after: Duration = Duration("30m")
    """With Automatic recovery, how long without a new critical XID before the taint is removed."""

    @model_validator(mode="after")
    def _one_rule_per_code(self) -> XidFault:
        seen: set[int] = set()
        for rule in self.repeat:
            twice = seen & set(rule.codes)
            if twice:
                raise ValueError(f"repeat: XID {sorted(twice)} listed in more than one rule")
            seen |= set(rule.codes)
        return self


class ThermalFault(FaultKindBase):
    """Heat: temperature over a limit, or thermal slowdown clock-event bits, for a duration."""

    gpu_temperature_above: float = Field(default=90.0, ge=0.0, le=150.0)
    """GPU temperature limit in degrees Celsius."""
    memory_temperature_above: float = Field(default=95.0, ge=0.0, le=150.0)
    """HBM temperature limit in degrees Celsius."""
    slowdown_clock_events: bool = True
    """Count the hardware/software thermal slowdown clock-event bits as over the limit."""
    for_duration: Duration = Duration("2m")
    """How long the condition must hold before the node is tainted."""
    recovery: Recovery = Recovery.AUTOMATIC
    """Automatic by default: untaint after recoveryAfter of healthy readings."""
    recovery_after: Duration = Duration("5m")
    """How long every reading must be healthy before the taint is removed."""


class PcieFault(Model):
    """A PCIe link trained below the GPU's maximum: fewer lanes (x8 of x16) at any load, or a lower generation while the GPU is busy.

    Judged over `lookback` on dcgm-exporter's DCGM_FI_DEV_PCIE_LINK_WIDTH/_GEN against _MAX_LINK_WIDTH/_GEN
    (the node agent reads the same from NVML). The GPU works, only its host transfers are slower: the node
    gets GPUDegraded=True and events, and is released automatically once the link is back at full width.
    From Prometheus, every GPU's link is checked every 90 s, or every lookback when shorter (a link already
    named: every cycle), so a new down-training is reported up to that much after its lookback has passed.
    """

    enabled: bool = True
    """Report down-trained links at all."""
    taint: bool = False
    """In Enforce mode, also taint the node gpuefficiency.io/gpu-fault=pcie:PreferNoSchedule under the faults circuit breaker (off: reported only)."""


class CircuitBreaker(Model):
    """Never quarantine more than a share of GPU nodes, and of GPUs, at once: mass faults are more likely bad data.

    Both caps apply: the node share bounds how many nodes hold any quarantine of ours, the GPU share
    how many GPUs it takes out (a node taint takes all of its GPUs, a device taint one).
    """

    max_tainted_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """Largest share of in-scope GPU nodes held tainted at once."""
    max_tainted_nodes: int | None = Field(default=None, ge=0)
    """Optional absolute cap on tainted nodes."""
    max_quarantined_gpu_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """Largest share of in-scope GPUs held quarantined at once: every GPU of a tainted node, plus each GPU under a DeviceTaintRule of ours. Default: maxTaintedFraction. While above zero, at least the GPUs of the largest in-scope node, as one node always may be tainted."""

    @property
    def gpu_fraction(self) -> float:
        """The GPU share in force: maxQuarantinedGpuFraction, else maxTaintedFraction."""
        if self.max_quarantined_gpu_fraction is None:
            return self.max_tainted_fraction
        return self.max_quarantined_gpu_fraction


class DeviceTaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class DeviceQuarantine(Model):
    """Single-GPU quarantine on nodes whose GPUs are DRA devices (a ResourceSlice lists them with a `uuid` attribute).

    A fault that a GPU reset repairs (an XID of the reset-gpu class on every GPU held) gets one
    DeviceTaintRule (resource.k8s.io/v1beta2) per faulty device instead of a node taint, so the
    node stays schedulable for its healthy GPUs. Other faults, and nodes whose GPUs come from the
    device plugin, keep the node taint.
    """

    enabled: bool = True
    """Quarantine single DRA devices where possible (off: always the node taint)."""
    effect: DeviceTaintEffect = DeviceTaintEffect.NO_SCHEDULE
    """NoSchedule keeps new claims off the device; NoExecute also removes the pods using it (drained first, see drainTimeout)."""


class FaultRules(Model):
    """GPU fault quarantine. Conditions and events are written in Observe mode too; taints only in Enforce."""

    enabled: bool = True
    """Detect faults at all."""
    ecc: EccFault = Field(default_factory=EccFault)
    """Double-bit ECC and row remapping faults."""
    xid: XidFault = Field(default_factory=XidFault)
    """Critical driver XID errors."""
    thermal: ThermalFault = Field(default_factory=ThermalFault)
    """Temperature and thermal slowdown."""
    pcie: PcieFault = Field(default_factory=PcieFault)
    """PCIe links trained below the GPU's maximum width or generation (degraded, never tainted by default)."""
    lookback: Duration = Duration("2m")
    """Window in which a counter increase or XID change counts as a new fault."""
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    """Cap on quarantined nodes."""
    device_quarantine: DeviceQuarantine = Field(default_factory=DeviceQuarantine)
    """Single-GPU quarantine with DRA device taints (Enforce mode only)."""
    drain_timeout: Duration = Duration("10m")
    """Where the effect is NoExecute (a kind's effect, or deviceQuarantine.effect): the operator first sets NoSchedule, evicts the pods on the faulty node (node taint) or those whose ResourceClaims hold the faulty GPU (device taint) through the Eviction API, so PodDisruptionBudgets are honoured and a refusal is retried every cycle, and sets NoExecute once they are gone or after this long (then Kubernetes removes what is left, without PodDisruptionBudgets). 0s sets NoExecute at once."""
