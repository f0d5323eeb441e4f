"""GPU models the simulator knows: the physical envelope profiles scale to (power, memory, clocks, links).

Numbers are the public datasheet values (and typical idle readings) so that, e.g., an idle H100 reads
~70 W and an idle L4 ~16 W, as operators expect from real dashboards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class GPUModel:
    model_name: str  # dcgm-exporter modelName label
    product: str  # nvidia.com/gpu.product node label (GPU feature discovery)
    family: str  # nvidia.com/gpu.family
    fb_total_mib: int
    fb_reserved_mib: int
    idle_power_w: float
    max_power_w: float  # board power limit
    sm_clock_idle_mhz: int
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    pcie_bytes_per_s: float  # practical one-direction PCIe bandwidth
    nvlink_bytes_per_s: float  # practical one-direction NVLink bandwidth; 0 without NVLink
    idle_temp_c: float
    max_temp_c: float  # typical temperature at full power with working cooling
    pcie_gen: int = 5  # the link the GPU trains to in its slot (PCIe generation, lanes)
    pcie_width: int = 16

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_bytes_per_s > 0


MODELS: Final[tuple[GPUModel, ...]] = (
    GPUModel(
        "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "hopper", 81559, 544,
        70.0, 700.0, 345, 1980, 2619, 55e9, 400e9, 32.0, 76.0, 5, 16,
    ),
    GPUModel(
        "NVIDIA H100 PCIe", "NVIDIA-H100-PCIe", "hopper", 81559, 544,
        48.0, 350.0, 345, 1755, 1593, 55e9, 0.0, 34.0, 78.0, 5, 16,
    ),
    GPUModel(
        "NVIDIA H200", "NVIDIA-H200", "hopper", 143771, 640,
        75.0, 700.0, 345, 1980, 3201, 55e9, 400e9, 32.0, 76.0, 5, 16,
    ),
    GPUModel(
        "NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "ampere", 81920, 527,
        58.0, 400.0, 210, 1410, 1593, 25e9, 250e9, 30.0, 72.0, 4, 16,
    ),
    GPUModel(
        "NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB", "ampere", 40960, 527,
        52.0, 400.0, 210, 1410, 1215, 25e9, 250e9, 30.0, 72.0, 4, 16,
    ),
    GPUModel(
        "NVIDIA L40S", "NVIDIA-L40S", "ada-lovelace", 46068, 481,
        35.0, 350.0, 210, 2520, 9001, 25e9, 0.0, 30.0, 75.0, 4, 16,
    ),
    GPUModel(
        "NVIDIA L4", "NVIDIA-L4", "ada-lovelace", 23034, 374,
        16.0, 72.0, 210, 2040, 6251, 25e9, 0.0, 36.0, 78.0, 4, 16,
    ),
    GPUModel(
        "Tesla T4", "Tesla-T4", "turing", 15360, 250,
        10.0, 70.0, 300, 1590, 5001, 12e9, 0.0, 35.0, 80.0, 3, 16,
    ),
)  # fmt: skip

DEFAULT_MODEL: Final = MODELS[0]
#: The local cluster's own nodes (``cluster.sh up``), round-robin: a Hopper and an Ampere node.
CLUSTER_MODELS: Final = (MODELS[0], MODELS[3])


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


_BY_KEY: Final[dict[str, GPUModel]] = {
    **{_key(m.model_name): m for m in MODELS},
    **{_key(m.product): m for m in MODELS},
}


def find_model(name: str) -> GPUModel:
    """Look a model up by its modelName or product label, ignoring case, spaces and dashes."""
    try:
        return _BY_KEY[_key(name)]
    except KeyError:
        known = ", ".join(m.product for m in MODELS)
        raise ValueError(f"unknown GPU model {name!r}; known: {known}") from None
