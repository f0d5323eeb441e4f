"""Kopf handlers, kept thin: watch policies into a registry; a scheduler thread runs the cycles.

No finalizers and no Kopf bookkeeping on policies: deleting a policy never waits for the operator,
and removes nothing users need (pod annotations stay until a policy judges the pod again).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from gpu_efficiency import malloc_tuning, metrics
from gpu_efficiency.api.policy import GROUP, PLURAL, VERSION
from gpu_efficiency.apiclient import load_api_client
from gpu_efficiency.config import OperatorConfig
from gpu_efficiency.runtime.deps import build_runner
from gpu_efficiency.runtime.fault_wake import FaultWake
from gpu_efficiency.runtime.scheduler import PolicyRegistry, Scheduler
from gpu_efficiency.selfservice.service import start_selfservice
from gpu_efficiency.slackapp.service import start_slack_actions
from gpu_efficiency.sources.kube.cluster_cache import CachedClusterReader

log = logging.getLogger(__name__)


def initial_memo(config: OperatorConfig) -> kopf.Memo:
    """The memo to start Kopf with (``kopf.run(memo=...)``): how the configuration reaches the handlers."""
    return kopf.Memo(config=config)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = memo.get("config")
    if not isinstance(config, OperatorConfig):
        raise RuntimeError("start the operator with `gpu-efficiency run`: Kopf's memo holds no configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's only errors
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    runner = build_runner(config, watch=True)
    registry = PolicyRegistry()
    wake = FaultWake(config.fault_wake_min_gap) if config.fault_wake_min_gap > 0 else None
    scheduler = Scheduler(runner, registry, wake=wake)
    if wake is not None and isinstance(runner.reader, CachedClusterReader):
        runner.reader.cache.nodes.on_change = scheduler.node_changed  # early fault cycles
    runner.reader.start()  # every replica, leader or not: a failover starts with a warm cache
    if runner.dra is not None:
        runner.dra.start()
    if runner.owners is not None:
        runner.owners.start()
    runner.leader.start()
    scheduler.start()
    memo.runner, memo.registry, memo.scheduler = runner, registry, scheduler
    metrics.serve(config.metrics_port)
    if config.selfservice_port:  # every replica serves the page; only the leader writes clicks
        memo.selfservice = start_selfservice(
            config, load_api_client(config.api_timeout), runner.leader.is_leader, runner.source_for
        )
        if config.slack_signing_secret_file:  # Slack's buttons: the same tokens and the same clicks
            memo.slack_actions = start_slack_actions(config, memo.selfservice)
    elif config.slack_signing_secret_file:
        log.warning("--slack-signing-secret-file is set but --selfservice-port is 0: no Slack buttons")
    log.info(
        "started: prometheus=%s dry_run=%s leader_election=%s identity=%s watch_cache=%s malloc=%s",
        config.prometheus_url,
        config.dry_run,
        config.leader_election,
        config.identity,
        config.watch_cache,
        malloc_tuning.APPLIED or "unchanged",
    )


@kopf.on.event(GROUP, VERSION, PLURAL)
def track(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the registry current; a new or edited policy is evaluated at once."""
    memo.registry.observe(event.get("type"), body)


@kopf.on.probe(id="scheduler")
def scheduler_alive(memo: kopf.Memo, **_: Any) -> str:
    """Fail /healthz (liveness) while no policy cycle completes: one thread runs every policy, so a
    call hung past every timeout would otherwise stop them all while the process looks healthy."""
    scheduler: Scheduler | None = getattr(memo, "scheduler", None)
    problem = scheduler.stalled() if scheduler is not None else None
    if problem is not None:
        raise kopf.PermanentError(problem)  # permanent: a probe must answer now, not retry
    return "ok"


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    slack_actions = getattr(memo, "slack_actions", None)
    if slack_actions is not None:
        slack_actions.stop()
    selfservice = getattr(memo, "selfservice", None)
    if selfservice is not None:
        selfservice.server.stop()
    scheduler: Scheduler | None = getattr(memo, "scheduler", None)
    if scheduler is not None:
        scheduler.stop()
        memo.runner.leader.stop()
        memo.runner.reader.stop()
        if memo.runner.dra is not None:
            memo.runner.dra.stop()
        if memo.runner.owners is not None:
            memo.runner.owners.stop()
