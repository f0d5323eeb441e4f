"""``gpu-efficiency-sim agent``: the product's agent command on the fake NVML, scripted by ``--fake-*``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpu_efficiency.agent.cli import add_agent_command
from gpu_efficiency.agent.nvml.types import NvmlBackend
from gpu_efficiency.agent.pods import Attribution
from gpu_efficiency_sim.fake_nvml.scenario import build_fake
from gpu_efficiency_sim.profiles import PROFILES


def fake_backend(args: argparse.Namespace) -> tuple[NvmlBackend, Attribution]:
    """The fake NVML and its static pod attribution, as the ``--fake-*`` flags describe them."""
    return build_fake(
        args.node_name,
        scenario=args.fake_scenario,
        gpus=args.fake_gpus,
        profile=args.fake_profile,
        pods=args.fake_pods,
        inbox=args.fake_inbox,
    )


def add_fake_agent_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``agent``: every flag of ``gpu-efficiency agent``, plus the fake backend's."""
    p = add_agent_command(subparsers, backend_factory=fake_backend)
    p.description = f"{p.description} This one reads a simulated NVML (test and demo harness)."
    p.add_argument("--fake-scenario", type=Path, help="YAML of GPUs, faults and changes over time")
    p.add_argument("--fake-gpus", type=int, default=8, help="without a scenario: GPU count")
    p.add_argument("--fake-profile", choices=sorted(PROFILES), default="idle", help="workload profile")
    p.add_argument("--fake-pods", default="", help="ns/pod[/container]=GPU-uuid-or-index,...")
    p.add_argument(
        "--fake-inbox",
        type=Path,
        help='directory polled every 50 ms for *.json steps applied at once, e.g. {"gpu": 3, "event": "xid", "xid": 48}',
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m gpu_efficiency_sim.fake_nvml agent ...``: the agent alone, without loading the rest of
    the harness (the benchmark measures the agent process's memory)."""
    parser = argparse.ArgumentParser(prog="gpu-efficiency-sim")
    add_fake_agent_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))
