"""``gpu-efficiency keep POD 4h -n NAMESPACE`` (or ``NAMESPACE/POD``): keep a warned pod's GPU with one command.

It sets the pod annotation ``gpuefficiency.io/keep-for`` (what the warning's kubectl line sets), so
the operator honours it from when it first sees it, bounded by the policy's ``maxKeep``. A bad pod
reference or duration is refused before anything is written.
"""

from __future__ import annotations

import argparse
import sys

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_efficiency.api import names
from gpu_efficiency.engine.reclaim.acknowledge import parse_keep_for

EXIT_FAILED = 1
EXIT_USAGE = 2


class KeepError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def parse_pod(text: str) -> tuple[str, str]:
    """``team-a/nb-0`` -> (namespace, pod)."""
    namespace, _, pod = text.partition("/")
    if not namespace or not pod or "/" in pod:
        raise KeepError(f"expected NAMESPACE/POD (got {text!r})", EXIT_USAGE)
    return namespace, pod


def keep(core: client.CoreV1Api, target: str, duration: str) -> str:
    """Annotate the pod; the message says what was done and what bounds it."""
    namespace, pod = parse_pod(target)
    try:
        parse_keep_for(duration)
    except ValueError as exc:
        raise KeepError(str(exc), EXIT_USAGE) from None
    body = {"metadata": {"annotations": {names.KEEP_FOR: duration.strip()}}}
    try:
        core.patch_namespaced_pod(pod, namespace, body)
    except ApiException as exc:
        if exc.status == 404:
            raise KeepError(f"pod {namespace}/{pod} not found") from None
        raise KeepError(f"pod {namespace}/{pod} not annotated: HTTP {exc.status} {exc.reason}") from None
    return (
        f"pod {namespace}/{pod} annotated {names.KEEP_FOR}={duration.strip()}: its GPU is kept for "
        f"{duration.strip()} from when the operator sees it (at most the policy's idle.maxKeep)"
    )


def keep_main(args: argparse.Namespace) -> int:
    from gpu_efficiency.cli_common import CliError, load_client, pod_ref

    namespace, pod = pod_ref(args.pod, args)
    try:
        parse_keep_for(args.duration)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        message = keep(client.CoreV1Api(load_client(args)), f"{namespace}/{pod}", args.duration)
    except KeepError as exc:
        raise CliError(str(exc), exc.code) from None
    sys.stdout.write(message + "\n")
    return 0
