"""The NVML interface the agent depends on: a Protocol and plain dataclasses in NVML's own units.

Backends (real nvidia-ml-py, fake) translate their failures into ``NvmlError`` so nothing above this
layer imports pynvml; unit conversion to dcgm-exporter units happens once, in ``agent.collect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Protocol


class NvmlCode(IntEnum):
    """NVML return codes the agent tells apart (values are NVML's ``NVML_ERROR_*``)."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    LIB_RM_VERSION_MISMATCH = 18
    NO_DATA = 21
    UNKNOWN = 999


class NvmlError(Exception):
    """One failed NVML call; ``code`` is NVML's return code (unknown codes are kept as ints)."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{self.code_name}{': ' + detail if detail else ''}")

    @property
    def code_name(self) -> str:
        try:
            return f"NVML_ERROR_{NvmlCode(self.code).name}"
        except ValueError:
            return f"NVML_ERROR_{self.code}"

    @property
    def not_supported(self) -> bool:
        return self.code in (NvmlCode.NOT_SUPPORTED, NvmlCode.FUNCTION_NOT_FOUND)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A physical GPU, or a MIG device when ``parent_uuid`` is set."""

    index: int  # NVML index of the physical GPU (the parent's for a MIG device)
    uuid: str  # GPU-... or MIG-...
    name: str
    pci_bus_id: str
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None  # e.g. "1g.10gb", dcgm-exporter's GPU_I_PROFILE

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    @property
    def model(self) -> str:
        """The GPU model without the MIG profile NVML appends to a MIG device's name (dcgm's modelName)."""
        return self.name.split(" MIG ", 1)[0]

    @property
    def label_index(self) -> str:
        """Index as the agent reports it: "0", or "0/3" for GPU instance 3 on GPU 0."""
        return str(self.index) if self.gpu_instance_id is None else f"{self.index}/{self.gpu_instance_id}"


@dataclass(frozen=True, slots=True)
class Utilization:
    gpu: float  # percent of time a kernel ran (nvidia-smi's "GPU-Util")
    memory: float  # percent of time memory was read or written


@dataclass(frozen=True, slots=True)
class Memory:
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class EccMode:
    current: bool
    pending: bool


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class PcieLink:
    """The PCIe link now and the best the GPU and its slot can train to."""

    generation: int
    width: int
    max_generation: int
    max_width: int


@dataclass(frozen=True, slots=True)
class GpmMetrics:
    """GPM metrics over the interval since the previous call, in NVML units (None: metric failed)."""

    graphics_util: float | None = None  # percent 0-100
    sm_util: float | None = None  # percent 0-100
    sm_occupancy: float | None = None  # percent 0-100
    any_tensor_util: float | None = None  # percent 0-100
    dram_bw_util: float | None = None  # percent 0-100
    pcie_rx_mib_s: float | None = None
    pcie_tx_mib_s: float | None = None
    nvlink_rx_mib_s: float | None = None
    nvlink_tx_mib_s: float | None = None


class Probe(StrEnum):
    """One NVML query the collector makes per GPU; unsupported fields are reported by probe name."""

    UTILIZATION = "utilization"
    MEMORY = "memory"
    POWER = "power"
    POWER_LIMIT = "power_limit"
    TEMPERATURE = "temperature"
    MEMORY_TEMPERATURE = "memory_temperature"
    SLOWDOWN_TEMPERATURE = "slowdown_temperature"
    SHUTDOWN_TEMPERATURE = "shutdown_temperature"
    CLOCK_EVENT_REASONS = "clock_event_reasons"
    SM_CLOCK = "sm_clock"
    PCIE_LINK = "pcie_link"
    ECC_MODE = "ecc_mode"
    ECC_DBE_VOLATILE = "ecc_dbe_volatile"
    ECC_DBE_AGGREGATE = "ecc_dbe_aggregate"
    REMAPPED_ROWS = "remapped_rows"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    GPM = "gpm"


class Threshold(StrEnum):
    SLOWDOWN = "slowdown"
    SHUTDOWN = "shutdown"


class EccCounter(StrEnum):
    VOLATILE = "volatile"  # since the last driver load
    AGGREGATE = "aggregate"  # lifetime of the board


class EventKind(StrEnum):
    XID = "xid"
    DBE = "dbe"  # double-bit (uncorrectable) ECC error


@dataclass(frozen=True, slots=True)
class NvmlEvent:
    uuid: str  # the physical GPU's UUID
    kind: EventKind
    data: int  # the XID code for XID events
    gpu_instance_id: int | None = None


class NvmlBackend(Protocol):
    """What the agent needs from NVML. Every method may raise ``NvmlError``; device methods take a UUID."""

    name: str

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def devices(self) -> list[DeviceInfo]: ...
    def mig_devices(self, parent: DeviceInfo) -> list[DeviceInfo]: ...
    def utilization(self, uuid: str) -> Utilization: ...
    def memory(self, uuid: str) -> Memory: ...
    def power_usage_mw(self, uuid: str) -> int: ...
    def power_limit_mw(self, uuid: str) -> int: ...
    def temperature_c(self, uuid: str) -> int: ...
    def memory_temperature_c(self, uuid: str) -> int: ...
    def temperature_threshold_c(self, uuid: str, threshold: Threshold) -> int: ...
    def clock_event_reasons(self, uuid: str) -> int: ...
    def sm_clock_mhz(self, uuid: str) -> int: ...
    def pcie_link(self, uuid: str) -> PcieLink: ...
    def ecc_mode(self, uuid: str) -> EccMode: ...
    def ecc_uncorrected(self, uuid: str, counter: EccCounter) -> int: ...
    def remapped_rows(self, uuid: str) -> RemappedRows: ...
    def retired_pages_pending(self, uuid: str) -> bool: ...
    def gpm_metrics(self, uuid: str) -> GpmMetrics | None:
        """Metrics since the previous call; None on the first call (GPM needs two samples)."""
        ...

    def compute_pids(self, uuid: str) -> list[int]: ...
    def open_events(self, uuids: list[str]) -> dict[str, str]:
        """Register XID and DBE events; returns UUID -> why registration failed, for those that did."""
        ...

    def wait_event(self, timeout_s: float) -> NvmlEvent | None: ...
    def close_events(self) -> None: ...
