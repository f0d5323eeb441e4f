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


def cmd_cleanup(args: argparse.Namespace) -> int:
    from gpu_efficiency.cleanup import cleanup_main

    return cleanup_main(args)


def installed_version() -> str:
    """The installed distribution's version (pyproject's ``version``; the image installs the wheel)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-efficiency-operator")
    except PackageNotFoundError:
        return "unknown (not installed: run from a source tree)"


#: Subcommands that talk to the cluster: their failures are one line and an exit code, never a traceback.
CLUSTER_COMMANDS = frozenset({"report", "explain", "restore", "keep", "cleanup"})
PLUGIN_PROG = "kubectl gpu-efficiency"

REPORT_EXAMPLES = """\
  gpu-efficiency report --policy cluster-diagnosis          # every namespace
  gpu-efficiency report -n team-a -o yaml                   # one namespace, for tools
  kubectl gpu-efficiency report --context prod --policy-file policy.yaml"""
EXPLAIN_EXAMPLES = """\
  gpu-efficiency explain nb-0 -n team-a --policy cluster-diagnosis
  gpu-efficiency explain team-a/nb-0 -o json"""
RESTORE_EXAMPLES = """\
  gpu-efficiency restore deployment/llm-serve -n team-a
  kubectl gpu-efficiency restore notebook/alice --context prod -n team-b"""
KEEP_EXAMPLES = """\
  gpu-efficiency keep nb-0 4h -n team-a
  gpu-efficiency keep team-a/nb-0 90m"""
CLEANUP_EXAMPLES = """\
  gpu-efficiency cleanup --dry-run           # what would be removed, and owners still reclaimed
  gpu-efficiency cleanup -o yaml             # remove it, print the record for tools"""


def _cluster_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, helptext: str, examples: str
) -> argparse.ArgumentParser:
    from gpu_efficiency.cli_common import add_cluster_flags, exit_codes_epilog

    p = sub.add_parser(
        name,
        help=helptext,
        description=helptext[0].upper() + helptext[1:] + ".",
        epilog=exit_codes_epilog(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cluster_flags(p)
    p.set_defaults(prog=p.prog)
    return p


def build_parser(prog: str = "gpu-efficiency") -> argparse.ArgumentParser:
    from gpu_efficiency.cli_common import add_namespace_flag, add_output_flag
    from gpu_efficiency.config import add_setting_arguments

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the GPU efficiency operator or its node agent, report and explain.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    parser.set_defaults(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    add_setting_arguments(run, "run")
    # the flag's old name, so deployments and scripts written for it keep working
    run.add_argument("--namespace", dest="namespace", default=None, help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)

    crd = sub.add_parser("crd", help="print the GPUEfficiencyPolicy CRD generated from the models")
    crd.set_defaults(func=cmd_crd)

    for name, func, helptext, examples in (
        (
            "report",
            cmd_report,
            "dry-run view of the cluster against a policy: waste, verdicts, would-be actions",
            REPORT_EXAMPLES,
        ),
        (
            "explain",
            cmd_explain,
            "every signal, threshold and rule behind one pod's verdict",
            EXPLAIN_EXAMPLES,
        ),
    ):
        p = _cluster_command(sub, name, helptext, examples)
        add_setting_arguments(p, name)  # only what observing needs, not every `run` flag
        p.add_argument(
            "--policy", help="name of a GPUEfficiencyPolicy in the cluster (default: built-in defaults)"
        )
        p.add_argument("--policy-file", help="a policy YAML file instead of one in the cluster")
        add_output_flag(p)
        if name == "explain":
            add_namespace_flag(p, "the pod's namespace (default: the context's namespace)")
            p.add_argument("pod", help="POD (in -n NAMESPACE) or NAMESPACE/POD")
        else:
            add_namespace_flag(
                p, "report only this namespace (default: every namespace)", all_namespaces=True
            )
        p.set_defaults(func=func)

    restore = _cluster_command(
        sub,
        "restore",
        "undo a reclaim: scale back, resume or start the owner (KIND/NAME -n NAMESPACE)",
        RESTORE_EXAMPLES,
    )
    restore.add_argument(
        "target", help="KIND/NAME, e.g. deployment/notebook (statefulset, job, jobset, notebook, lws)"
    )
    add_namespace_flag(restore, "the owner's namespace (default: the context's namespace)")
    restore.set_defaults(func=cmd_restore)

    keep = _cluster_command(
        sub,
        "keep",
        "keep a warned pod's GPU: sets gpuefficiency.io/keep-for (POD DURATION -n NAMESPACE)",
        KEEP_EXAMPLES,
    )
    keep.add_argument("pod", help="POD (in -n NAMESPACE) or NAMESPACE/POD")
    keep.add_argument("duration", help="how long, e.g. 4h or 90m (bounded by the policy's idle.maxKeep)")
    add_namespace_flag(keep, "the pod's namespace (default: the context's namespace)")
    keep.set_defaults(func=cmd_keep)

    cleanup = _cluster_command(
        sub,
        "cleanup",
        "after uninstalling: remove the operator's taints, node conditions, DeviceTaintRules and "
        "annotations, and list the owners still reclaimed with their restore commands",
        CLEANUP_EXAMPLES,
    )
    cleanup.add_argument("--dry-run", action="store_true", help="show what would be removed; change nothing")
    cleanup.add_argument(
        "--force", action="store_true", help="clean up even while an operator still holds its Lease"
    )
    add_output_flag(cleanup)
    cleanup.set_defaults(func=cmd_cleanup)

    try:
        from gpu_efficiency.agent.cli import add_agent_command
    except ImportError:  # pragma: no cover - only while the agent package is incomplete
        pass
    else:
        add_agent_command(sub)
    return parser


def _negative_duration(argv: Sequence[str]) -> str | None:
    """``keep POD -1h``: argparse would read -1h as an unknown flag; name the real mistake instead."""
    command = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if command is None or argv[command] != "keep":
        return None
    return next((a for a in argv[command + 1 :] if len(a) > 1 and a[0] == "-" and a[1].isdigit()), None)


def main(argv: Sequence[str] | None = None, prog: str = "gpu-efficiency") -> int:
    from gpu_efficiency.cli_common import (
        EXIT_INTERRUPTED,
        EXIT_USAGE,
        CliError,
        api_failure,
        fail,
    )
    from gpu_efficiency.settings import SettingError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    negative = _negative_duration(argv)
    if negative is not None:
        sys.stderr.write(
            f"{prog} keep: error: {negative!r} is negative: write how long to keep the GPU, like 4h\n"
        )
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except SettingError as exc:
        return fail(args, str(exc), EXIT_USAGE)
    except CliError as exc:
        return fail(args, str(exc), exc.code)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.command not in CLUSTER_COMMANDS or not _is_api_failure(exc):
            raise
        error = api_failure(exc)
        return fail(args, str(error), error.code)
    return code


def _is_api_failure(exc: Exception) -> bool:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return isinstance(exc, ApiException | HTTPError | OSError)


def kubectl_plugin() -> int:
    """``kubectl gpu-efficiency ...``: the executable ``kubectl-gpu_efficiency`` on the PATH (kubectl
    maps the dash of a plugin's command to an underscore in its file name)."""
    return main(prog=PLUGIN_PROG)


if __name__ == "__main__":
    sys.exit(main())
