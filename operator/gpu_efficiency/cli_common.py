"""What every cluster command of the CLI shares, so it behaves as kubectl users expect.

``-n/--namespace`` is the namespace you look at (never the operator's own: that is
``--operator-namespace``), ``--kubeconfig`` and ``--context`` pick the cluster as kubectl's do, read
commands print ``-o table|json|yaml``, and every failure is one line ``PROG: error: MESSAGE`` with an
exit code from :data:`EXIT_CODES` (no traceback: a researcher without a kubeconfig should read what
to do, not Python internals).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CLUSTER = 3
EXIT_METRICS = 4
EXIT_INTERRUPTED = 130

#: Every exit code of the CLI and its meaning (the table in docs/cli.md and each command's --help).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done (report, explain: the metrics were available)"),
    (EXIT_FAILED, "nothing done: the API refused the change, or there is nothing to restore"),
    (EXIT_USAGE, "bad arguments, a bad policy file, or no such pod or policy: nothing was changed"),
    (EXIT_CLUSTER, "no Kubernetes credentials, or the API server cannot be reached"),
    (EXIT_METRICS, "report, explain: metrics unavailable (what is known is still printed)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
OUTPUTS = ("table", "json", "yaml")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class CliError(Exception):
    """A failure the CLI reports in one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def exit_codes_epilog(examples: str = "") -> str:
    """``--help`` text after the options: examples, then the exit codes."""
    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)
    return (f"examples:\n{examples}\n" if examples else "") + f"exit codes:\n{codes}"


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``, as kubectl's (default: $KUBECONFIG or ~/.kube/config, its
    current context; in a pod without either flag: the pod's service account)."""
    parser.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)"
    )
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")


def add_namespace_flag(parser: argparse.ArgumentParser, what: str, *, all_namespaces: bool = False) -> None:
    """``-n/--namespace`` (stored as ``target_namespace``; the operator's own is ``--operator-namespace``)."""
    parser.add_argument("-n", "--namespace", dest="target_namespace", metavar="NAMESPACE", help=what)
    if all_namespaces:
        parser.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="every namespace (the default; overrides -n)",
        )


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table (default) for people; json or yaml (the same document) for tools",
    )


def load_client(args: argparse.Namespace, timeout: float | None = None) -> Any:
    """The API client of the kubeconfig and context the flags name (CliError, exit 3, when there are
    no usable credentials)."""
    from kubernetes.config import ConfigException

    from gpu_efficiency.apiclient import DEFAULT_API_TIMEOUT, load_api_client

    try:
        return load_api_client(
            timeout or DEFAULT_API_TIMEOUT,
            config_file=getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
        )
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise CliError(f"cannot load Kubernetes credentials: {exc}", EXIT_CLUSTER) from None


def current_namespace(args: argparse.Namespace) -> str:
    """``-n`` if given, else the kubeconfig context's namespace, else (in a pod) the pod's, else
    ``default``: the namespace kubectl would use."""
    given: str | None = getattr(args, "target_namespace", None)
    if given:
        return given
    from kubernetes import config as kube_config

    kubeconfig = getattr(args, "kubeconfig", None)
    context = getattr(args, "context", None)
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call,unused-ignore]
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
        namespace = ((chosen or {}).get("context") or {}).get("namespace")
        if namespace:
            return str(namespace)
    except (kube_config.ConfigException, OSError, ValueError, TypeError, KeyError):
        if not kubeconfig and not context and SERVICE_ACCOUNT_NAMESPACE.is_file():
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return "default"


def pod_ref(text: str, args: argparse.Namespace) -> tuple[str, str]:
    """``POD`` (in -n, else the context's namespace) or ``NAMESPACE/POD`` -> (namespace, pod); anything
    else is a usage error, raised before any credential is read."""
    parts = text.split("/")
    if len(parts) == 1 and parts[0]:
        return current_namespace(args), parts[0]
    if len(parts) == 2 and all(parts):
        given = getattr(args, "target_namespace", None)
        if given and given != parts[0]:
            raise CliError(f"{text!r} names namespace {parts[0]!r} but -n says {given!r}", EXIT_USAGE)
        return parts[0], parts[1]
    raise CliError(f"expected POD (with -n NAMESPACE) or NAMESPACE/POD, got {text!r}", EXIT_USAGE)


def render(doc: Any, output: str, table: Callable[[Any], str]) -> str:
    """The document as ``output`` asks: the table function's text, JSON or YAML."""
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).rstrip("\n")
    return table(doc)


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """One error line in argparse's style (``gpu-efficiency keep: error: ...``); returns the code."""
    prog = getattr(args, "prog", None) or "gpu-efficiency"
    sys.stderr.write(f"{prog}: error: {message}\n")
    return code


def api_failure(exc: BaseException) -> CliError:
    """An API call that failed outside a command's own handling: a refused request (HTTP status) is
    exit 1, a connection that failed (refused, timed out, TLS) exit 3."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        if exc.status in (401,):
            return CliError(f"the API server refused the credentials: HTTP 401 {exc.reason}", EXIT_CLUSTER)
        return CliError(f"the API server refused: HTTP {exc.status} {exc.reason}", EXIT_FAILED)
    return CliError(f"cannot reach the Kubernetes API: {exc}", EXIT_CLUSTER)
