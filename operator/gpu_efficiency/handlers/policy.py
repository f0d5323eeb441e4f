"""Kopf handlers: thin. One daemon per policy runs its evaluation loop at the policy's own interval."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from gpu_efficiency import metrics
from gpu_efficiency.api.durations import parse_duration
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.handlers.cycle import CycleRunner
from gpu_efficiency.handlers.deps import build_runner
from gpu_efficiency.handlers.leader import LeaderElector

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 60.0

#: Set by the CLI before kopf.run; read once by the startup handler.
CONFIG: OperatorConfig | None = None


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = CONFIG or OperatorConfig()
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's only errors
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    runner = build_runner(config)
    runner.leader.start()
    memo.runner = runner
    metrics.serve(config.metrics_port)
    log.info(
        "started: prometheus=%s dry_run=%s leader_election=%s identity=%s",
        config.prometheus_url,
        config.dry_run,
        config.leader_election,
        config.identity,
    )


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runner: CycleRunner | None = getattr(memo, "runner", None)
    if runner is not None:
        runner.leader.stop()


def _interval(spec: Any) -> float:
    try:
        return max(1.0, parse_duration(str(spec.get("interval", "60s"))))
    except ValueError:
        return DEFAULT_INTERVAL


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
def evaluate(
    stopped: kopf.DaemonStopped, name: str, uid: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """Run cycles until the policy is deleted; the live body means spec edits apply next cycle."""
    runner: CycleRunner = memo.runner
    while not stopped:
        spec, status, meta = (
            dict(body.get("spec") or {}),
            dict(body.get("status") or {}),
            body.get("metadata") or {},
        )
        try:
            report = runner.run(
                name=name,
                uid=uid,
                generation=int(meta.get("generation") or 0),
                spec_raw=spec,
                status_raw=status,
            )
            if report.ran:
                log.info(
                    "policy %s: cycle %.2fs, %d actions, %d writes, %d queries",
                    name,
                    report.seconds,
                    len(report.plan.actions) if report.plan else 0,
                    report.writes,
                    report.queries,
                )
        except Exception:
            metrics.CYCLES.labels(name, "error").inc()
            log.exception("policy %s: cycle failed; retrying next interval", name)
        stopped.wait(_interval(spec))
    runner.forget(name)


def leader_of(memo: kopf.Memo) -> LeaderElector | None:
    runner: CycleRunner | None = getattr(memo, "runner", None)
    leader = runner.leader if runner else None
    return leader if isinstance(leader, LeaderElector) else None
