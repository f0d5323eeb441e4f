"""The local cluster's fake GPU nodes: ``cluster.sh add-nodes`` applies exactly what the harness builds.

cluster.sh runs here against a fake kubectl (a script in ``GPUEFF_LOCALCLUSTER_BIN`` that records what
``kubectl create -f -`` receives and reports every node Ready), so the test needs no cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu_efficiency_sim.gpu_models import CLUSTER_MODELS, find_model
from gpu_efficiency_sim.manifests import cluster_nodes, node_ip

REPO = Path(__file__).resolve().parents[3]
CLUSTER_SH = REPO / "hack" / "localcluster" / "cluster.sh"
FAKE_KUBECTL = """#!/usr/bin/env bash
# $1 = --kubeconfig, $2 = its file
shift 2
case "$1 $2" in
  "get nodes") cat "$STATE_FOR_TEST/existing" ;;
  "create -f") cat > "$STATE_FOR_TEST/created.json" ;;
  "get node") echo True ;;
  *) echo "fake kubectl: unexpected $*" >&2; exit 1 ;;
esac
"""


def add_nodes(tmp_path: Path, existing: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("kubectl", FAKE_KUBECTL), ("kube-apiserver", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "existing").write_text("".join(f"{n}\n" for n in existing))
    env = {
        **os.environ,
        "GPUEFF_LOCALCLUSTER_BIN": str(bin_dir),
        "GPUEFF_STATE_DIR": str(tmp_path / "state"),
        "GPUEFF_PYTHON": sys.executable,
        "STATE_FOR_TEST": str(tmp_path),
    }
    return subprocess.run(
        ["bash", str(CLUSTER_SH), "add-nodes", *args], env=env, capture_output=True, text=True, timeout=60
    )


def created(tmp_path: Path) -> list[dict[str, Any]]:
    body = json.loads((tmp_path / "created.json").read_text())
    assert body["kind"] == "List"
    items: list[dict[str, Any]] = body["items"]
    return items


def test_add_nodes_applies_the_harness_nodes_after_the_existing_ones(tmp_path: Path) -> None:
    run = add_nodes(tmp_path, ["gpu-node-0", "gpu-node-1", "other-7"], "3")
    assert run.returncode == 0, run.stderr
    defaults = [m.product for m in CLUSTER_MODELS]
    assert created(tmp_path) == cluster_nodes("gpu-node-", 2, 3, defaults, 8)
    products = [n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in created(tmp_path)]
    assert products == [defaults[0], defaults[1], defaults[0]]  # round-robin by node index
    assert "added 3 fake GPU node(s): gpu-node-2 gpu-node-3 gpu-node-4" in run.stderr


def test_add_nodes_passes_models_gpus_and_prefix(tmp_path: Path) -> None:
    run = add_nodes(tmp_path, [], "2", "--gpus", "4", "--models", "NVIDIA-L4,Tesla T4", "--prefix", "x-")
    assert run.returncode == 0, run.stderr
    nodes = created(tmp_path)
    assert nodes == cluster_nodes("x-", 0, 2, ["NVIDIA-L4", "Tesla T4"], 4)
    t4 = find_model("Tesla-T4")
    labels = nodes[1]["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.memory"]) == (t4.product, "15360")
    assert labels["nvidia.com/gpu.family"] == "turing"
    assert nodes[1]["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert nodes[0]["status"]["addresses"][0] == {"type": "InternalIP", "address": node_ip("x-0")}


def test_add_nodes_rejects_an_unknown_model_and_creates_nothing(tmp_path: Path) -> None:
    run = add_nodes(tmp_path, [], "1", "--models", "NVIDIA-H100-NVL")
    assert run.returncode != 0
    assert "unknown GPU model 'NVIDIA-H100-NVL'" in run.stderr
    assert not (tmp_path / "created.json").exists()


def test_node_ips_are_distinct_addresses_in_10_128_0_0_9() -> None:
    ips = [node_ip(f"gpu-node-{i}") for i in range(300)]
    assert len(set(ips)) == len(ips)
    octets = [[int(o) for o in ip.split(".")] for ip in ips]
    assert {o[0] for o in octets} == {10}
    assert all(128 <= o[1] <= 255 and 1 <= o[3] <= 254 for o in octets)
