"""Notification sinks: webhooks that warnings and actions are posted to, besides Kubernetes events."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from gpu_efficiency.api.policy.base import Model


class SinkType(StrEnum):
    CLOUD_EVENTS = "CloudEvents"  # CloudEvents 1.0, structured mode (application/cloudevents+json)
    SLACK = "Slack"  # a Slack incoming webhook (text + blocks); Mattermost and others accept it too


#: Event reasons a sink can be sent: the warnings and actions a person may want to hear of.
NotifyReason = Literal[
    "GPUIdleEvictionScheduled",
    "GPUIdleEvicted",
    "GPUReclaimed",
    "EvictionBlocked",
    "GPUActiveAgain",
    "GPUIdle",
    "GPUUnderutilized",
    "ReclaimSkipped",
    "ReclaimIneffective",
    "ReclaimReverted",
    "GPUFaultDetected",
    "NodeTainted",
    "NodeUntainted",
]
#: What a sink is sent when its ``reasons`` is empty: the warning and the actions that take GPUs.
DEFAULT_NOTIFY_REASONS: tuple[str, ...] = (
    "GPUIdleEvictionScheduled",
    "GPUIdleEvicted",
    "GPUReclaimed",
    "EvictionBlocked",
    "GPUFaultDetected",
    "NodeTainted",
)


class NotifySink(Model):
    """One place warnings and actions are posted to (asynchronously: a failing sink never slows a cycle)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The sink's name (a DNS label), in metrics, conditions and logs."""
    type: SinkType
    """CloudEvents (structured-mode JSON for any webhook) or Slack (incoming-webhook text and blocks)."""
    url_secret_key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the webhook URL in the Secret the chart mounts into the operator (notify.secretName); the operator reads no Secrets."""
    reasons: list[NotifyReason] = Field(default_factory=list, max_length=16)
    """Event reasons sent; empty: GPUIdleEvictionScheduled, GPUIdleEvicted, GPUReclaimed, EvictionBlocked, GPUFaultDetected, NodeTainted."""
    namespaces: list[str] = Field(default_factory=list, max_length=256)
    """Only pods in these namespaces (empty: all); node events (faults) are sent only when this is empty."""
    max_per_minute: int = Field(default=30, ge=1, le=600)
    """Rate limit of posts to this sink; a burst waits in a bounded queue, the excess is dropped and counted."""

    def wants(self, reason: str, namespace: str) -> bool:
        """Whether a notification with this reason about an object in ``namespace`` goes here."""
        if reason not in (self.reasons or DEFAULT_NOTIFY_REASONS):
            return False
        if not self.namespaces:
            return True
        return bool(namespace) and namespace in self.namespaces
