"""``gpu-efficiency report`` and ``explain``: the operator's judgement, read-only, for people and tools.

Both observe exactly as a cycle does (same source, same engine) and never write. The report judges
as if the policy were in Enforce mode, so it shows what *would* be warned or evicted. A policy named
with ``--policy`` brings its status: the budgets it has spent this hour hold back what they hold back
in the cluster, and the notes say so.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpu_efficiency.actuators.status import parse_status
from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION, GPUEfficiencyPolicySpec, Mode
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.cli_common import (
    EXIT_CLUSTER,
    EXIT_METRICS,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    load_client,
    pod_ref,
    render,
)
from gpu_efficiency.config import OperatorConfig, config_from_args
from gpu_efficiency.engine.exporter_coverage import blind_summary, coverage, csv_lines, nodeless
from gpu_efficiency.engine.model import AnnotatePod, EvictPod, Plan, ReclaimOwner, Snapshot, Verdict
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import explain_pod, plan_cycle
from gpu_efficiency.engine.reclaim.waste import price_for
from gpu_efficiency.runtime.cycle import CycleRunner, format_validation_error, no_series_message
from gpu_efficiency.runtime.deps import build_runner


class ReportError(CliError):
    """Why a report or an explanation could not be made, with its exit code."""


def _progress(message: str) -> None:
    sys.stderr.write(f"… {message}\n")


def load_policy(
    args: argparse.Namespace, api_client: client.ApiClient
) -> tuple[str, GPUEfficiencyPolicySpec, GPUEfficiencyPolicyStatus]:
    """The policy to judge by: a file, a policy in the cluster (with its status, whose record of the
    hour's reclaims the budgets count), or the defaults (and an empty status)."""
    from pydantic import ValidationError

    try:
        if args.policy_file:
            doc = yaml.safe_load(Path(args.policy_file).read_text())
            name = (doc.get("metadata") or {}).get("name", Path(args.policy_file).stem)
            return (
                name,
                GPUEfficiencyPolicySpec.model_validate(doc.get("spec") or {}),
                GPUEfficiencyPolicyStatus(),
            )
        if args.policy:
            obj = cast(
                dict[str, Any],
                client.CustomObjectsApi(api_client).get_cluster_custom_object(
                    GROUP, VERSION, PLURAL, args.policy
                ),
            )
            spec = GPUEfficiencyPolicySpec.model_validate(obj.get("spec") or {})
            return args.policy, spec, parse_status(obj.get("status") or {})
    except ValidationError as exc:
        raise ReportError(f"invalid policy: {format_validation_error(exc)}", EXIT_USAGE) from exc
    except ApiException as exc:
        if exc.status == 404:
            raise ReportError(f"no GPUEfficiencyPolicy named {args.policy!r}", EXIT_USAGE) from exc
        raise
    except OSError as exc:
        raise ReportError(f"cannot read {args.policy_file}: {exc}", EXIT_USAGE) from exc
    except (yaml.YAMLError, AttributeError) as exc:  # not YAML, or YAML that is not a mapping
        raise ReportError(f"{args.policy_file} is not a policy document: {exc}", EXIT_USAGE) from exc
    return "defaults", GPUEfficiencyPolicySpec(), GPUEfficiencyPolicyStatus()


def observe(args: argparse.Namespace, config: OperatorConfig) -> tuple[Snapshot, Plan]:
    api_client = load_client(args, config.api_timeout)
    _progress("reading the policy")
    try:
        name, spec, status = load_policy(args, api_client)
        runner: CycleRunner = build_runner(
            replace(config, dry_run=True, leader_election=False, prometheus_refresh_budget=0), api_client
        )
        spec = spec.model_copy(update={"mode": Mode.ENFORCE})
        _progress(
            f"querying Prometheus at {spec.metrics.prometheus.url or config.prometheus_url} and the cluster"
        )
        runner.read_owners_always = True  # show every idle pod's owner, not only once clocks run
        snapshot, _, _ = runner.observe(name, 0, spec, status)
    except (ApiException, HTTPError, OSError) as exc:
        raise ReportError(f"cannot reach the Kubernetes API: {exc}", EXIT_CLUSTER) from exc
    return snapshot, plan_cycle(snapshot)


@dataclass
class NamespaceRow:
    namespace: str
    pods: int = 0
    gpus: int = 0
    idle_gpus: int = 0
    sm_active: list[float] = field(default_factory=list)
    gpu_util: list[float] = field(default_factory=list)
    waste_per_day: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "pods": self.pods,
            "gpus": self.gpus,
            "meanSmActive": _mean(self.sm_active),
            "meanGpuUtil": _mean(self.gpu_util),
            "idleGpus": self.idle_gpus,
            "idleGpuHoursPerDay": self.idle_gpus * 24.0,
            "estimatedWastePerDay": round(self.waste_per_day, 2),
        }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


PROJECTION = "the GPUs idle now, held idle for 24 h"


def build_report(
    snapshot: Snapshot, plan: Plan, *, currency: str = "USD", matchers: str | None = None
) -> dict[str, Any]:
    """The report as data; the per-day figures are a projection (:data:`PROJECTION`), not a history."""
    prices = cycle_params(snapshot.policy).prices  # normalised keys, as price_for expects
    pods = {(p.namespace, p.name): p for p in snapshot.pods}
    nodes = {n.name: n for n in snapshot.nodes}
    rows: dict[str, NamespaceRow] = defaultdict(lambda: NamespaceRow(""))
    for verdict in plan.verdicts:
        pod = pods.get((verdict.namespace, verdict.name))
        row = rows[verdict.namespace]
        row.namespace = verdict.namespace
        row.pods += 1
        gpus = pod.gpu_request if pod else len(verdict.gpus)
        row.gpus += gpus
        if verdict.activity_avg is not None:
            row.sm_active.append(verdict.activity_avg)
        if verdict.gpu_util_avg is not None:
            row.gpu_util.append(verdict.gpu_util_avg)
        if verdict.verdict is Verdict.IDLE:
            row.idle_gpus += gpus
            node = nodes.get(pod.node) if pod else None
            product = node.labels.get(names.GPU_PRODUCT_LABEL, "") if node else ""
            row.waste_per_day += gpus * 24.0 * price_for(product, prices, product)
    actions: list[dict[str, str]] = []
    for action in plan.actions:
        if isinstance(action, EvictPod):
            actions.append(
                {"pod": f"{action.namespace}/{action.name}", "action": "evict", "why": action.reason}
            )
        elif isinstance(action, ReclaimOwner):
            owner = f"{action.namespace}/{action.owner.kind.lower()}/{action.owner.name}"
            members = ", ".join(name for name, _ in action.pods)
            actions.append(
                {"pod": owner, "action": action.action, "why": f"{action.reason} (pods {members})"}
            )
        elif isinstance(action, AnnotatePod) and action.annotations.get(names.EVICT_AFTER):
            actions.append(
                {
                    "pod": f"{action.namespace}/{action.name}",
                    "action": "warn",
                    "why": f"idle; would be acted on after {action.annotations[names.EVICT_AFTER]}",
                }
            )
    return {
        "policy": snapshot.policy_name,
        "metricsAvailable": snapshot.metrics_available,
        "metricsError": snapshot.metrics_error,
        "currency": currency,
        "perDayProjection": PROJECTION,
        "namespaces": [rows[k].as_dict() for k in sorted(rows)],
        "pods": [
            {
                "pod": f"{v.namespace}/{v.name}",
                "verdict": v.verdict.value,
                "diagnosis": v.diagnosis.value,
                "activity": v.activity_avg,
                "activitySignal": v.activity_signal.name if v.activity_signal else None,
                "gpuUtil": v.gpu_util_avg,
                "efficiency": v.efficiency,
                "recommendation": v.recommendation,
                "reason": v.reason,
            }
            for v in sorted(plan.verdicts, key=lambda v: (v.namespace, v.name))
        ],
        "actions": actions,
        "stragglerGroups": [
            {
                "namespace": g.namespace,
                "group": g.name,
                "pods": len(g.pods),
                "gpus": g.gpus,
                "judged": g.judged,
                "why": g.why,
                "slower": list(g.slower),
                "reported": list(g.reported),
            }
            for g in plan.straggler_groups
        ],
        "owners": [n for n in plan.notes if ": owner " in n],
        "notes": list(plan.notes),
        "exporters": exporters(snapshot, matchers),
    }


def exporters(snapshot: Snapshot, matchers: str | None = None) -> dict[str, Any]:
    """Which dcgm-exporter generation the GPUs speak, what they are blind to (with the CSV lines
    that would serve it), whether any GPU names its node, and (``matchers``: the ones the fetch
    used) that no series was found at all, even where no GPU pod runs yet."""
    cover = coverage(snapshot.gpus)
    found_none = matchers is not None and snapshot.metrics_available and not snapshot.gpus
    return {
        "noSeries": no_series_message(matchers or "") if found_none else "",
        "generations": dict(cover.generations),
        "blind": dict(cover.blind),
        "csvLines": csv_lines(cover.blind),
        "nodeless": nodeless(cover),
    }


def render_exporters(exp: dict[str, Any]) -> list[str]:
    out = []
    if exp["noSeries"]:
        out.append(f"\n{exp['noSeries']}")
    if exp["generations"]:
        spoken = ", ".join(f"{gen} {n}" for gen, n in exp["generations"].items())
        out.append(f"\nExporter generations (GPUs): {spoken}")
    if exp["nodeless"]:
        out.append(f"\nNO GPU TIED TO A NODE: {exp['nodeless']}")
    if exp["blind"]:
        out.append(f"\nBlind spots (unknown, never healthy): {blind_summary(exp['blind'])}")
        if exp["csvLines"]:
            out.append("  add to dcgm-exporter's counters CSV (-f / the chart's metrics ConfigMap):")
            out += [f"    {line}" for line in exp["csvLines"]]
    return out


def _fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.0f}%" if pct else f"{value:.2f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def render_table(report: dict[str, Any]) -> str:
    out = [f"Policy: {report['policy']}"]
    if not report["metricsAvailable"]:
        out.append(
            f"METRICS UNAVAILABLE: {report['metricsError']}\nNo verdicts are possible; nothing would be evicted."
        )
    out.append("")
    out.append(
        _table(
            [
                "NAMESPACE",
                "PODS",
                "GPUS",
                "SM ACTIVE",
                "GPU UTIL",
                "IDLE GPUS",
                "IDLE GPU-H/DAY*",
                f"WASTE/DAY* ({report['currency']})",
            ],
            [
                [
                    r["namespace"],
                    str(r["pods"]),
                    str(r["gpus"]),
                    _fmt(r["meanSmActive"]),
                    _fmt(r["meanGpuUtil"]),
                    str(r["idleGpus"]),
                    f"{r['idleGpuHoursPerDay']:.0f}",
                    f"{r['estimatedWastePerDay']:.2f}",
                ]
                for r in report["namespaces"]
            ],
        )
    )
    out.append(
        f"* projected: {report['perDayProjection']}; waste at the policy's pricePerGpuHour, "
        f"in {report['currency']} (--currency)"
    )
    out.append("")
    out.append(
        _table(
            ["POD", "VERDICT", "DIAGNOSIS", "ACTIVITY", "GPU UTIL", "RECOMMENDATION"],
            [
                [
                    p["pod"],
                    p["verdict"],
                    p["diagnosis"],
                    _fmt(p["activity"]),
                    _fmt(p["gpuUtil"]),
                    p["recommendation"],
                ]
                for p in report["pods"]
            ],
        )
    )
    if report["stragglerGroups"]:
        out.append("\nJob groups (stragglers: a GPU slower than its group's median):")
        out.append(
            _table(
                ["NAMESPACE", "GROUP", "PODS", "GPUS", "JUDGED", "STRAGGLERS"],
                [
                    [
                        g["namespace"],
                        g["group"],
                        str(g["pods"]),
                        str(g["gpus"]),
                        "yes" if g["judged"] else f"no: {g['why']}",
                        str(len(g["slower"])) if g["judged"] else "-",
                    ]
                    for g in report["stragglerGroups"]
                ],
            )
        )
        for g in report["stragglerGroups"]:
            reported = set(g["reported"])
            out += [
                f"  {'reported' if entry in reported else 'slower now (not yet for forDuration)'}: {entry}"
                for entry in g["slower"]
            ]
    if report["owners"]:
        out.append(
            "\nOwners of idle pods (the action Enforce mode takes once all their GPU pods are idle and due):"
        )
        out += [f"  {line}" for line in report["owners"]]
    out += render_exporters(report["exporters"])
    if report["actions"]:
        out.append("\nWould act (Enforce mode):")
        out += [f"  {a['action']:5}  {a['pod']}: {a['why']}" for a in report["actions"]]
    return "\n".join(out)


def only_namespace(report: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The report of one namespace (``-n``): its rows, pods, actions, job groups and notes; notes about
    other namespaces' pods are left out, notes about the cluster kept. Judged over the whole cluster
    first, so the budgets it shows are the ones the operator would spend."""
    mine = f"{namespace}/"
    others = tuple(f"{ns}/" for ns in {p["pod"].split("/", 1)[0] for p in report["pods"]} if ns != namespace)

    def about_others(note: str) -> bool:
        return note.removeprefix("straggler in ").startswith(others) if others else False

    return {
        **report,
        "namespace": namespace,
        "namespaces": [r for r in report["namespaces"] if r["namespace"] == namespace],
        "pods": [p for p in report["pods"] if p["pod"].startswith(mine)],
        "actions": [a for a in report["actions"] if a["pod"].startswith(mine)],
        "stragglerGroups": [g for g in report["stragglerGroups"] if g["namespace"] == namespace],
        "owners": [n for n in report["owners"] if n.startswith(mine)],
        "notes": [n for n in report["notes"] if not about_others(n)],
    }


def report_main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    snapshot, plan = observe(args, config)
    report = build_report(snapshot, plan, currency=config.currency, matchers=config.prometheus_matchers)
    if args.target_namespace and not args.all_namespaces:
        report = only_namespace(report, args.target_namespace)
    sys.stdout.write(render(report, args.output, render_table) + "\n")
    return EXIT_OK if snapshot.metrics_available else EXIT_METRICS


def explain_main(args: argparse.Namespace) -> int:
    namespace, pod = pod_ref(args.pod, args)
    snapshot, plan = observe(args, config_from_args(args))
    if not any(p.namespace == namespace and p.name == pod for p in snapshot.pods):
        raise CliError(f"{namespace}/{pod} is not a running pod holding GPUs", EXIT_USAGE)
    lines = explain_pod(snapshot, namespace, pod)
    verdict = next((v for v in plan.verdicts if v.namespace == namespace and v.name == pod), None)
    doc = {
        "pod": f"{namespace}/{pod}",
        "verdict": verdict.verdict.value if verdict else None,
        "diagnosis": verdict.diagnosis.value if verdict else None,
        "metricsAvailable": snapshot.metrics_available,
        "metricsError": snapshot.metrics_error,
        "explanation": lines,
    }

    def text(doc: dict[str, Any]) -> str:
        head = [] if doc["metricsAvailable"] else [f"METRICS UNAVAILABLE: {doc['metricsError']}"]
        return "\n".join([*head, *doc["explanation"]])

    sys.stdout.write(render(doc, args.output, text) + "\n")
    return EXIT_OK if snapshot.metrics_available else EXIT_METRICS
