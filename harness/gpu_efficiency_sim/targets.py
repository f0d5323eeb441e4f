"""Registering simulator targets with the local Prometheus through its file service discovery."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

DEFAULT_STATE_DIR: Final = "/tmp/gpueff-localcluster"
#: The job the GPU Operator's dcgm-exporter gets, one the operator reads by default (config.DEFAULT_MATCHERS).
DEFAULT_JOB: Final = "nvidia-dcgm-exporter"


def targets_dir(state_dir: str | None = None) -> Path:
    """``$GPUEFF_STATE_DIR/prometheus/targets``: the directory the local Prometheus watches."""
    base = state_dir or os.environ.get("GPUEFF_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(base) / "prometheus" / "targets"


def register(
    name: str,
    addresses: Sequence[str],
    *,
    directory: Path | None = None,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Write ``<name>.json`` atomically (Prometheus may read it at any moment); return its path."""
    directory = directory or targets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = directory / f".{name}.json.tmp"
    tmp.write_text(json.dumps([{"targets": list(addresses), "labels": dict(labels or {"job": DEFAULT_JOB})}]))
    tmp.replace(path)
    return path


def unregister(path: Path) -> None:
    path.unlink(missing_ok=True)
