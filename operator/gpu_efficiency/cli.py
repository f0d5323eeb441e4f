"""``gpu-efficiency``: run the operator or the node agent, report and explain."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def cmd_run(args: argparse.Namespace) -> int:
    """Run the operator (Kopf, cluster-wide, standalone: our Lease decides who acts)."""
    from gpu_efficiency import malloc_tuning

    malloc_tuning.tune()  # before any thread starts: see malloc_tuning.py
    import kopf

    from gpu_efficiency.config import config_from_args
    from gpu_efficiency.runtime import kopf_wiring  # registers the handlers

    config = config_from_args(args)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    # Kopf owns the logging set-up (one handler, JSON when asked for): no basicConfig of ours.
    level = config.log_level.upper()
    kopf.configure(
        debug=level == "DEBUG",
        quiet=level in ("WARNING", "ERROR"),
        log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL,
    )
    kopf.run(
        clusterwide=True, standalone=True, liveness_endpoint=liveness, memo=kopf_wiring.initial_memo(config)
    )
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from gpu_efficiency.api.crd import render_crd

    sys.stdout.write(render_crd())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gpu_efficiency.report import report_main

    return report_main(args)


def cmd_explain(args: argparse.Namespace) -> int:
    from gpu_efficiency.report import explain_main

    return explain_main(args)


def cmd_restore(args: argparse.Namespace) -> int:
    from gpu_efficiency.restore import restore_main

    return restore_main(args)


def cmd_keep(args: argparse.Namespace) -> int:
    from gpu_efficiency.keep import keep_main

    return keep_main(args)


def installed_version() -> str:
    """The installed distribution's version (pyproject's ``version``; the image installs the wheel)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-efficiency-operator")
    except PackageNotFoundError:
        return "unknown (not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    from gpu_efficiency.config import add_setting_arguments

    parser = argparse.ArgumentParser(
        prog="gpu-efficiency",
        description="Run the GPU efficiency operator or its node agent, report and explain.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    add_setting_arguments(run, "run")
    run.set_defaults(func=cmd_run)

    crd = sub.add_parser("crd", help="print the GPUEfficiencyPolicy CRD generated from the models")
    crd.set_defaults(func=cmd_crd)

    for name, func, helptext in (
        (
            "report",
            cmd_report,
            "dry-run view of the cluster against a policy: waste, verdicts, would-be actions",
        ),
        ("explain", cmd_explain, "every signal, threshold and rule behind one pod's verdict"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_setting_arguments(p, name)  # only what observing needs, not every `run` flag
        p.add_argument(
            "--policy", help="name of a GPUEfficiencyPolicy in the cluster (default: built-in defaults)"
        )
        p.add_argument("--policy-file", help="a policy YAML file instead of one in the cluster")
        p.add_argument("--output", "-o", choices=("table", "json"), default="table")
        if name == "explain":
            p.add_argument("pod", help="NAMESPACE/POD")
        p.set_defaults(func=func)

    restore = sub.add_parser(
        "restore", help="undo a reclaim: scale back, resume or start the owner (KIND/NAME -n NAMESPACE)"
    )
    restore.add_argument(
        "target", help="KIND/NAME, e.g. deployment/notebook (statefulset, job, jobset, notebook, lws)"
    )
    restore.add_argument("-n", "--namespace", default="default", help="the owner's namespace")
    restore.set_defaults(func=cmd_restore)

    keep = sub.add_parser(
        "keep", help="keep a warned pod's GPU: sets gpuefficiency.io/keep-for (NAMESPACE/POD DURATION)"
    )
    keep.add_argument("pod", help="NAMESPACE/POD")
    keep.add_argument("duration", help="how long, e.g. 4h or 90m (bounded by the policy's idle.maxKeep)")
    keep.set_defaults(func=cmd_keep)

    try:
        from gpu_efficiency.agent.cli import add_agent_command
    except ImportError:  # pragma: no cover - only while the agent package is incomplete
        pass
    else:
        add_agent_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gpu_efficiency.settings import SettingError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except SettingError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
