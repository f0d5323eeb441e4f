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
#: Target label of an exporter that stands for one exporter per node (the simulator, a node agent run
#: on this host): the local Prometheus gives each of its series the ``instance`` that node's own
#: exporter would have, ``<node>:9400`` (hack/localcluster/cluster.sh), as a hostNetwork
#: DaemonSet pod is scraped at its node's address. The operator believes a GPU only from a target on
#: its node (safety rule 9), and the local cluster has no pod network to run one per node on.
NODE_LOCAL_LABEL: Final = "gpueff_node_local"


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
    node_local: bool = True,
) -> Path:
    """Write ``<name>.json`` atomically (Prometheus may read it at any moment); return its path.
    ``node_local``: the targets export each node's GPUs as that node's own exporter would
    (``NODE_LOCAL_LABEL``); False for a target that stands for a tenant's pod (a forger)."""
    directory = directory or targets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = directory / f".{name}.json.tmp"
    labels = dict(labels or {"job": DEFAULT_JOB})
    if node_local:
        labels[NODE_LOCAL_LABEL] = "true"
    tmp.write_text(json.dumps([{"targets": list(addresses), "labels": labels}]))
    tmp.replace(path)
    return path


def unregister(path: Path) -> None:
    path.unlink(missing_ok=True)
