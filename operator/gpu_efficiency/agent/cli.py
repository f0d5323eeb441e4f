"""``gpu-efficiency agent``: the per-node agent (DaemonSet). ``add_agent_command`` plugs it into the CLI.

The NVML backend comes from a factory: the product's is real NVML; the harness
(``gpu-efficiency-sim agent``) passes its fake NVML and adds the flags that script it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import disable_created_metrics

from gpu_efficiency.agent.naming import AGENT_GENERATIONS, DEFAULT_NAMES
from gpu_efficiency.agent.nvml.types import NvmlBackend
from gpu_efficiency.agent.pods import DEFAULT_SOCKET, Attribution, Attributor, PodResourcesClient
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency.agent.server import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    AgentServer,
    parse_listen,
)
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.exporter_fields import Generation

log = logging.getLogger(__name__)

#: Builds the NVML backend from the parsed flags, with a static pod attribution (GPU UUID -> pods);
#: a non-empty one replaces the kubelet's (and the cgroup fallback's) for every GPU.
BackendFactory = Callable[[argparse.Namespace], tuple[NvmlBackend, Attribution]]


def nvml_backend(args: argparse.Namespace) -> tuple[NvmlBackend, Attribution]:
    """The real NVML (nvidia-ml-py); pods come from the kubelet."""
    from gpu_efficiency.agent.nvml.real import PynvmlBackend

    return PynvmlBackend(), {}


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return seconds


def _listen(text: str) -> str:
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of at least 1")
    return int(text)


def _xids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError("comma-separated XID numbers") from exc


def add_agent_command(
    subparsers: Any, *, backend_factory: BackendFactory = nvml_backend
) -> argparse.ArgumentParser:
    """Add the ``agent`` subcommand to an argparse subparsers object; runs ``args.func(args) -> int``
    with the backend ``backend_factory`` builds (the caller adds the flags its factory reads)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        help="run the per-node GPU agent (NVML metrics, fault events, pod attribution)",
        description="Per-node agent: reads NVML, serves dcgm-exporter-compatible /metrics, /snapshot, "
        "/healthz and /readyz, and optionally writes the GPUHealthy node condition.",
    )
    p.add_argument("--listen", type=_listen, default="0.0.0.0:9400", help="HOST:PORT (default %(default)s)")
    p.add_argument(
        "--max-connections",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="HTTP connections served at once; more get 503 (default %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=_duration,
        default=f"{DEFAULT_REQUEST_TIMEOUT_S:g}s",
        help="wall-clock limit to receive a request and send its answer (default %(default)s)",
    )
    p.add_argument(
        "--auth",
        choices=("none", "tokenreview"),
        default="none",
        help="/metrics and /snapshot: open, or a bearer token checked by TokenReview and a "
        "SubjectAccessReview for `get` on the path (default %(default)s)",
    )
    p.add_argument("--interval", type=_duration, default="1s", help="sample interval (default %(default)s)")
    p.add_argument(
        "--history", type=_duration, default="15m", help="rolling history kept (default %(default)s)"
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="this node's name (default $NODE_NAME, else the hostname)",
    )
    p.add_argument("--pod-resources-socket", default=DEFAULT_SOCKET, help="kubelet pod-resources socket")
    p.add_argument("--proc-root", default="/proc", help="host /proc for the cgroup fallback (needs hostPID)")
    p.add_argument("--no-cgroup-fallback", action="store_true", help="attribute pods via the kubelet only")
    p.add_argument("--attribution-interval", type=_duration, default="10s", help="pod attribution refresh")
    p.add_argument("--write-node-condition", action="store_true", help="patch the GPUHealthy node condition")
    p.add_argument("--critical-xids", type=_xids, help="XIDs that make GPUHealthy False (default: policy's)")
    p.add_argument(
        "--exporter-names",
        choices=[g.value for g in AGENT_GENERATIONS],
        default=DEFAULT_NAMES.value,
        help="whose metric names, units and node label /metrics serves, as dcgm-exporter of that "
        "generation would: legacy (CLOCK_THROTTLE_REASONS, Hostname), 4.x (Hostname), 4.8.3+ (hostname), "
        "4.9+ (DCGM 4.6+ names, GPU_UTIL ratio, Hz, bytes); the JSON snapshot is unaffected "
        "(default %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=lambda args: run_agent(args, backend_factory=backend_factory))
    return p


def build_agent(args: argparse.Namespace, *, backend_factory: BackendFactory = nvml_backend) -> Agent:
    """The agent the flags describe. Pods come from the kubelet (cgroup fallback) unless the backend
    factory gives a static attribution."""
    backend, static = backend_factory(args)
    attributor = Attributor(
        backend,
        kubelet=PodResourcesClient(args.pod_resources_socket),
        static=static or None,
        cgroup_fallback=not args.no_cgroup_fallback,
        proc_root=args.proc_root,
    )
    config = AgentConfig(
        node_name=args.node_name,
        interval_s=args.interval,
        history_s=args.history,
        attribution_interval_s=args.attribution_interval,
        exporter_names=Generation(args.exporter_names),
    )
    return Agent(backend, config, attributor)


def run_agent(args: argparse.Namespace, *, backend_factory: BackendFactory = nvml_backend) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    disable_created_metrics()  # type: ignore[no-untyped-call,unused-ignore]  # dcgm-exporter has no *_created
    agent = build_agent(args, backend_factory=backend_factory)
    gate = None
    if args.auth == "tokenreview":
        from gpu_efficiency.agent.auth import Gate, in_cluster_reviewer

        gate = Gate(in_cluster_reviewer())
    server = AgentServer(
        agent,
        args.listen,
        max_connections=args.max_connections,
        request_timeout_s=args.request_timeout,
        gate=gate,
    )
    writer = None
    if args.write_node_condition:
        from gpu_efficiency.agent.nodecondition import NodeConditionWriter

        writer = NodeConditionWriter(agent, args.node_name, args.critical_xids)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    agent.start()
    if writer is not None:
        writer.start()
    log.info(
        "agent for node %s (%s backend) listening on %s", args.node_name, agent.backend.name, args.listen
    )
    stop.wait()
    log.info("stopping")
    if writer is not None:
        writer.stop()
    agent.stop()
    server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m gpu_efficiency.agent.cli``), until the main CLI wires the command."""
    parser = argparse.ArgumentParser(prog="gpu-efficiency")
    add_agent_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
