"""``gpu-efficiency-sim``: serve the simulated dcgm-exporter, run and validate scenario files, the demo,
and the node agent on a fake NVML (``agent``).

Exit codes of ``run``: 0 every expectation passed, 1 a failure (expectation or setup), 2 the scenario
file is invalid. ``validate`` exits 2 on an invalid file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency_sim import catalog
from gpu_efficiency_sim.exposition import PodLabels
from gpu_efficiency_sim.fake_nvml.command import add_fake_agent_command
from gpu_efficiency_sim.generations import DEFAULT_EXPORTER, SIMULATED
from gpu_efficiency_sim.gpu_models import CLUSTER_MODELS, MODELS, find_model
from gpu_efficiency_sim.operator_process import DEFAULT_OPERATOR_CMD
from gpu_efficiency_sim.profiles import PROFILES
from gpu_efficiency_sim.scenario import ScenarioError, json_schema, load_scenario
from gpu_efficiency_sim.simulator import SimNode, SimOptions

log = logging.getLogger("gpu_efficiency_sim")

#: Serve mode without a scenario simulates GPU nodes, but not those a scenario run owns.
DEFAULT_NODE_SELECTOR = "nvidia.com/gpu.present=true,!sim.gpuefficiency.io/scenario"


def positive_seconds(text: str) -> float:
    """A period in seconds for a background loop: zero or less would spin it (or render without end)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The harness's commands: the DCGM-exporter simulator, the scenario runner and the guided demo."""
    parser = argparse.ArgumentParser(
        prog="gpu-efficiency-sim",
        description="Test and demo harness of the GPU efficiency operator: the DCGM-exporter simulator, "
        "the scenario runner and the guided demo (not part of the operator image).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve simulated dcgm-exporter /metrics for GPU nodes")
    serve.add_argument("--scenario", type=Path, help="play this scenario's nodes, profiles and faults")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port", type=int, default=9400, help="first port (0: free ports); target i uses port+i"
    )
    serve.add_argument(
        "--targets", type=int, default=1, help="split the nodes over this many targets (ports)"
    )
    serve.add_argument(
        "--prerender",
        type=positive_seconds,
        metavar="SECONDS",
        help="render every SECONDS in the background and serve the latest frame (large fleets)",
    )
    serve.add_argument(
        "--static-nodes",
        action="append",
        default=[],
        metavar="PREFIX:COUNT[:GPUS[:MODEL[:EXPORTER]]]",
        help="simulate these nodes instead of discovering them (repeatable; EXPORTER as --exporter)",
    )
    serve.add_argument(
        "--node-selector", default=DEFAULT_NODE_SELECTOR, help="nodes to discover from the API"
    )
    serve.add_argument(
        "--node-poll",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="list the nodes every SECONDS (a new node is served from the next listing)",
    )
    serve.add_argument("--no-kube", action="store_true", help="no Kubernetes API: every GPU is free (idle)")
    serve.add_argument(
        "--namespace-prefix", default="", help="as given to `gpu-efficiency-sim run` (scenario namespaces)"
    )
    serve.add_argument("--register", metavar="NAME", help="register the targets with the local Prometheus")
    serve.add_argument(
        "--targets-dir", type=Path, help="Prometheus file-SD directory (default: local cluster's)"
    )
    _add_presentation_args(serve)
    _add_kube_args(serve)
    serve.set_defaults(func=cmd_serve)

    run = sub.add_parser("run", help="run a scenario against the current cluster; exit 1 on any failure")
    run.add_argument("scenario", type=Path)
    run.add_argument("--keep", action="store_true", help="leave the created objects in place")
    run.add_argument(
        "--operator-cmd",
        default=DEFAULT_OPERATOR_CMD,
        help=f"command starting the operator; $VARS expand (default: {DEFAULT_OPERATOR_CMD!r})",
    )
    run.add_argument("--no-operator", action="store_true", help="do not start the operator")
    run.add_argument("--namespace-prefix", default="", help="prefix of every namespace the scenario creates")
    run.add_argument("--prometheus-url", help="default: $GPUEFF_PROMETHEUS_URL or http://127.0.0.1:19090")
    run.add_argument(
        "--targets-dir", type=Path, help="Prometheus file-SD directory (default: local cluster's)"
    )
    run.add_argument("--log-dir", type=Path, help="where the operator's log goes (default: a temp dir)")
    run.add_argument("--json", type=Path, dest="json_out", help="also write the results as JSON here")
    _add_kube_args(run)
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check scenario files; exit 2 if any is invalid")
    validate.add_argument("scenarios", type=Path, nargs="+")
    validate.set_defaults(func=cmd_validate)

    schema = sub.add_parser("schema", help="print the scenario file's JSON schema")
    schema.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    schema.set_defaults(func=cmd_schema)

    cleanup = sub.add_parser(
        "cleanup", help="delete objects left by `gpu-efficiency-sim run --keep` (or a crash)"
    )
    target = cleanup.add_mutually_exclusive_group(required=True)
    target.add_argument("scenario", type=Path, nargs="?")
    target.add_argument("--all", action="store_true", help="every scenario's objects")
    _add_kube_args(cleanup)
    cleanup.set_defaults(func=cmd_cleanup)

    profiles = sub.add_parser("profiles", help="list the workload profiles")
    profiles.set_defaults(func=cmd_profiles)

    models = sub.add_parser("models", help="list the GPU models")
    models.set_defaults(func=cmd_models)

    nodes = sub.add_parser(
        "node-manifests",
        help="print the local cluster's fake GPU nodes as a JSON List (cluster.sh up/add-nodes applies it)",
    )
    nodes.add_argument("count", type=int, help="how many nodes")
    nodes.add_argument("--first", type=int, default=0, help="index of the first node (name suffix)")
    nodes.add_argument("--prefix", default="gpu-node-")
    nodes.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    nodes.add_argument(
        "--models",
        default=",".join(m.product for m in CLUSTER_MODELS),
        help="comma-separated GPU models, round-robin by node index (default: %(default)s)",
    )
    nodes.set_defaults(func=cmd_node_manifests)

    sample = sub.add_parser("sample", help="print a profile's readings over time (CSV)")
    sample.add_argument("profile", choices=sorted(PROFILES))
    sample.add_argument("--model", default=MODELS[0].product)
    sample.add_argument("--seconds", type=float, default=60.0)
    sample.add_argument("--step", type=float, default=1.0)
    sample.add_argument("--seed", type=int, default=1)
    sample.add_argument("--metrics", help="comma-separated metric names (default: the main signals)")
    sample.set_defaults(func=cmd_sample)

    demo = sub.add_parser("demo", help="the guided demo on the local cluster (make demo)")
    demo.add_argument("--keep", action="store_true", help="leave the demo objects in place")
    demo.add_argument("--timeout", type=float, default=420.0, help="give up after this many seconds")
    demo.set_defaults(func=cmd_demo)

    add_fake_agent_command(sub)
    return parser


def _add_presentation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-labels", choices=[p.value for p in PodLabels], help="default: scenario's or standard"
    )
    parser.add_argument(
        "--no-sm-active", action="store_true", help="the exporter's default CSV: no SM_ACTIVE & co"
    )
    parser.add_argument(
        "--old-clock-events-name", action="store_true", help="serve DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    )
    parser.add_argument(
        "--exporter",
        choices=[g.value for g in SIMULATED],
        help="dcgm-exporter generation of nodes that name none (default: scenario's or "
        f"{DEFAULT_EXPORTER.value}); see `schema`, simulator.exporter",
    )
    parser.add_argument(
        "--default-profile",
        default="compute-bound",
        choices=sorted(PROFILES),
        help="profile of pods that no scenario workload or sim.gpuefficiency.io/profile annotation describes",
    )


def _add_kube_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config or in-cluster")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def _logging(args: argparse.Namespace) -> None:
    level = getattr(args, "log_level", "warning").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def _invalid(error: ScenarioError) -> int:
    print(str(error), file=sys.stderr)
    return 2


# ---- commands ---------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from gpu_efficiency_sim.runner import RunOptions, run_scenario

    _logging(args)
    options = RunOptions(
        keep=args.keep,
        operator=not args.no_operator,
        operator_cmd=args.operator_cmd,
        namespace_prefix=args.namespace_prefix,
        kubeconfig=args.kubeconfig,
        prometheus_url=args.prometheus_url,
        targets_dir=args.targets_dir,
        log_dir=args.log_dir,
    )
    try:
        result = run_scenario(args.scenario, options)
    except ScenarioError as e:
        return _invalid(e)
    if args.json_out is not None:
        args.json_out.write_text(
            json.dumps(
                {
                    "scenario": result.scenario,
                    "path": str(result.path),
                    "run": result.run_id,
                    "passed": result.passed,
                    "error": result.error,
                    "durationSeconds": round(result.duration_s, 1),
                    "operatorLog": str(result.operator_log) if result.operator_log else None,
                    "expectations": [
                        {"name": o.name, "passed": o.passed, "observed": o.observed, "at": round(o.t, 1)}
                        for o in result.outcomes
                    ],
                },
                indent=2,
            )
        )
    return result.exit_code


def cmd_validate(args: argparse.Namespace) -> int:
    code = 0
    for path in args.scenarios:
        try:
            loaded = load_scenario(path)
        except ScenarioError as e:
            code = _invalid(e)
            continue
        s = loaded.scenario
        counts = (
            f"{len(s.node_names)} node(s), {len(s.workloads)} workload(s), {len(s.faults)} fault(s), "
            f"{len(loaded.policies)} polic(y/ies), {len(s.expectations)} expectation(s)"
        )
        print(f"{path}: OK ({counts})")
    return code


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from gpu_efficiency_sim.runner import cleanup_scenario

    _logging(args)
    try:
        count = cleanup_scenario(args.scenario, args.kubeconfig, all_runs=args.all)
    except ScenarioError as e:
        return _invalid(e)
    print(f"deleted {count} object(s) (nodes, namespaces, policies)")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    width = max(len(name) for name in PROFILES)
    for profile in PROFILES.values():
        print(f"{profile.name:<{width}}  {profile.description}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    for m in MODELS:
        print(
            f"{m.product:<24} modelName={m.model_name!r} memory={m.fb_total_mib}MiB "
            f"power={m.idle_power_w:g}-{m.max_power_w:g}W nvlink={'yes' if m.has_nvlink else 'no'}"
        )
    return 0


def cmd_node_manifests(args: argparse.Namespace) -> int:
    from gpu_efficiency_sim.manifests import cluster_nodes

    if args.count < 0 or args.first < 0 or args.gpus < 1:
        print("node-manifests: count and --first must be >= 0, --gpus >= 1", file=sys.stderr)
        return 2
    try:
        items = cluster_nodes(args.prefix, args.first, args.count, args.models.split(","), args.gpus)
    except ValueError as error:
        print(f"node-manifests: {error}", file=sys.stderr)
        return 2
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=1)
    print()
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from gpu_efficiency.engine.model import Signal
    from gpu_efficiency_sim.profiles import sample

    model = find_model(args.model)
    names = (
        args.metrics.split(",")
        if args.metrics
        else [
            Signal.GPU_UTIL, Signal.SM_ACTIVE, Signal.SM_OCCUPANCY, Signal.TENSOR_ACTIVE, Signal.DRAM_ACTIVE,
            Signal.PCIE_RX_BYTES, Signal.NVLINK_RX_BYTES, Signal.POWER, Signal.GPU_TEMP, Signal.FB_USED,
            catalog.CLOCK_EVENTS_NEW,
        ]
    )  # fmt: skip
    print(",".join(["t", *(str(n).removeprefix("DCGM_FI_") for n in names)]))
    t = 0.0
    while t <= args.seconds:
        values = sample(args.profile, t, args.seed, model)
        print(",".join([f"{t:g}", *(str(values.get(str(n), "")) for n in names)]))
        t += args.step
    return 0


def _static_nodes(specs: list[str]) -> list[SimNode]:
    nodes = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) < 2 or len(parts) > 5:
            raise SystemExit(f"--static-nodes {spec!r}: use PREFIX:COUNT[:GPUS[:MODEL[:EXPORTER]]]")
        prefix, count = parts[0], int(parts[1])
        gpus = int(parts[2]) if len(parts) > 2 else 8
        model = find_model(parts[3]) if len(parts) > 3 and parts[3] else MODELS[0]
        exporter = None
        if len(parts) > 4:
            try:
                exporter = Generation(parts[4])
                if exporter not in SIMULATED:
                    raise ValueError(parts[4])
            except ValueError:
                raise SystemExit(
                    f"--static-nodes {spec!r}: unknown exporter {parts[4]!r}; use one of "
                    + ", ".join(g.value for g in SIMULATED)
                ) from None
        nodes += [SimNode(f"{prefix}{i}", gpus, model, exporter=exporter) for i in range(count)]
    return nodes


def cmd_serve(args: argparse.Namespace) -> int:
    from gpu_efficiency_sim.playbook import sim_faults, sim_nodes, sim_options, workload_plays
    from gpu_efficiency_sim.server import MetricsServer
    from gpu_efficiency_sim.simulator import Simulator
    from gpu_efficiency_sim.targets import DEFAULT_JOB, register, targets_dir, unregister

    _logging(args)
    plays: list[Any] = []
    faults: list[Any] = []
    options = SimOptions()
    nodes: list[SimNode] = _static_nodes(args.static_nodes)
    if args.scenario is not None:
        try:
            scenario = load_scenario(args.scenario).scenario
        except ScenarioError as e:
            return _invalid(e)
        nodes = nodes or sim_nodes(scenario)
        plays = workload_plays(scenario, args.namespace_prefix)
        faults = sim_faults(scenario)
        options = sim_options(scenario)
    options = SimOptions(
        pod_labels=PodLabels(args.pod_labels) if args.pod_labels else options.pod_labels,
        sm_active=options.sm_active and not args.no_sm_active,
        clock_events_metric=catalog.CLOCK_EVENTS_OLD
        if args.old_clock_events_name
        else options.clock_events_metric,
        driver_version=options.driver_version,
        default_profile=args.default_profile,
        exporter=Generation(args.exporter) if args.exporter else options.exporter,
    )
    sim = Simulator(nodes, workloads=plays, faults=faults, options=options)
    stoppers: list[Any] = []
    if not args.no_kube:
        from gpu_efficiency_sim.kube import NodePoller, PodWatcher, api_client

        api = api_client(args.kubeconfig)
        if not nodes:
            poller = NodePoller(
                api, sim.set_nodes, label_selector=args.node_selector, interval_s=args.node_poll
            )
            poller.poll()
            stoppers.append(poller.start())
        stoppers.append(PodWatcher(api, sim.set_pods).start())
    count = max(1, args.targets)
    servers = [
        MetricsServer(
            sim,
            host=args.host,
            port=args.port + i if args.port else 0,
            shard=(i, count) if count > 1 else None,
            prerender_s=args.prerender,
        ).start()
        for i in range(count)
    ]
    registered = None
    if args.register:
        registered = register(
            args.register,
            [s.address for s in servers],
            directory=args.targets_dir or targets_dir(),
            labels={"job": DEFAULT_JOB, "simulator": args.register},
        )
    gpus = sum(n.gpus for n in sim.nodes)
    print(
        f"serving {len(sim.nodes)} node(s), {gpus} GPU(s) on "
        + ", ".join(s.url for s in servers)
        + (f"; registered in {registered}" if registered else ""),
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if registered is not None:
        unregister(registered)
    for stopper in stoppers:
        stopper.stop()
    for server in servers:
        server.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gpu_efficiency_sim.demo import demo_main

    return demo_main(args)


def main(argv: list[str] | None = None) -> int:
    """``gpu-efficiency-sim`` and ``python -m gpu_efficiency_sim``."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


__all__ = ["build_parser", "main"]
