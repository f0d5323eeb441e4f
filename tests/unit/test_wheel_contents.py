"""The operator's wheel, built from what the Dockerfile copies, holds no test or demo harness.

The image installs only this wheel, so a simulator, scenario runner or demo module in its file list
would ship in the image. The harness lives in harness/gpu_efficiency_sim, a package of its own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Modules that are the product: the wheel must have them (so the test fails on an empty wheel).
CORE = (
    "gpu_efficiency/cli.py",
    "gpu_efficiency/config.py",
    "gpu_efficiency/report.py",
    "gpu_efficiency/engine/planner.py",
    "gpu_efficiency/runtime/cycle.py",
    "gpu_efficiency/agent/cli.py",
    "gpu_efficiency/agent/proto/podresources.proto",
    "gpu_efficiency/py.typed",
)

#: Path parts that belong to the harness, never to the image.
HARNESS = (
    "gpu_efficiency_sim",
    "gpu_efficiency/sim/",
    "gpu_efficiency/demo.py",
    "scenarios/",
    "gpu_efficiency/agent/nvml/fake",
    "gpu_efficiency/agent/scenario",
)


def _wheel_files(tmp_path: Path) -> list[str]:
    """Build the wheel as the Dockerfile's first stage does: from pyproject.toml, README.md and operator/."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "operator", src / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    out = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_has_the_operator_and_no_harness(tmp_path: Path) -> None:
    files = _wheel_files(tmp_path)
    missing = [path for path in CORE if path not in files]
    assert not missing, f"the wheel lacks core modules: {missing}"
    harness = [path for path in files if any(part in path for part in HARNESS)]
    assert not harness, f"the wheel (and so the image) ships harness files: {harness}"
