"""The public names (a stable API, documented in docs/what-you-see.md): annotations, labels, taints, conditions, event reasons.

Changing any value here is an API change that needs a migration note.
"""

from __future__ import annotations

from typing import Final

from gpu_efficiency.api.policy import PREFIX

# Pod annotations written by the operator.
STATE: Final = PREFIX + "state"  # Idle | Underutilized | Efficient | Unknown | Warned
SM_ACTIVE: Final = PREFIX + "sm-active"  # activity 0-1, 3 decimals
ACTIVITY_SIGNAL: Final = PREFIX + "activity-signal"  # which signal the activity came from
GPU_UTIL: Final = PREFIX + "gpu-util"  # 0-1, 3 decimals
EFFICIENCY: Final = PREFIX + "efficiency"  # SM activity / GPU util, 0-1, 3 decimals (like sm-active)
DIAGNOSIS: Final = PREFIX + "diagnosis"
RECOMMENDATION: Final = PREFIX + "recommendation"
IDLE_SINCE: Final = PREFIX + "idle-since"  # RFC3339
EVICT_AFTER: Final = PREFIX + "evict-after"  # RFC3339
EVICTION_BLOCKED: Final = PREFIX + "eviction-blocked"  # RFC3339 of the first refusal
POLICY: Final = PREFIX + "policy"  # name of the policy that judged the pod
KEEP_SEEN: Final = PREFIX + "keep-until-seen"  # when the operator first saw keep-until/keep-for (bounds it)
STRAGGLER: Final = PREFIX + "straggler"  # on every pod of a job group: which GPU is slow, how much, why
STRAGGLER_SINCE: Final = PREFIX + "straggler-since"  # on a straggling pod: RFC3339, since first seen slow
SELF_SERVICE: Final = PREFIX + "self-service"  # on a warned pod: the signed link to keep or release it
RELEASE: Final = (
    PREFIX + "release"
)  # RFC3339: its user gave the GPU back (self-service page): reclaim next cycle

# Pod annotations set by users.
EXEMPT: Final = PREFIX + "exempt"  # "true": opt out (only where the policy allows)
KEEP_UNTIL: Final = PREFIX + "keep-until"  # RFC3339: acknowledgement, bounded by policy maxKeep
KEEP_FOR: Final = (
    PREFIX + "keep-for"
)  # Go duration ("4h"): acknowledgement from when first seen, bounded by maxKeep
#: Every acknowledgement annotation a pod's owner may set (honoured where the policy allows).
ACKNOWLEDGEMENTS: Final = (KEEP_UNTIL, KEEP_FOR)

# Namespace annotations set by admins.
NOTIFY_CHANNEL: Final = PREFIX + "notify-channel"  # the Slack channel of the namespace's warnings
#: Key in the notify Secret of the namespace's own Slack webhook (a Slack app's webhook ignores ``channel``).
SLACK_URL_SECRET_KEY: Final = PREFIX + "slack-url-secret-key"

#: Every pod annotation the operator may write; it removes only these.
OPERATOR_POD_ANNOTATIONS: Final = (
    STATE,
    SM_ACTIVE,
    ACTIVITY_SIGNAL,
    GPU_UTIL,
    EFFICIENCY,
    DIAGNOSIS,
    RECOMMENDATION,
    IDLE_SINCE,
    EVICT_AFTER,
    EVICTION_BLOCKED,
    POLICY,
    KEEP_SEEN,
    STRAGGLER,
    STRAGGLER_SINCE,
    SELF_SERVICE,
    RELEASE,
)

# Pod annotation written while the GPU the pod runs on is held faulty (removed on recovery):
# JSON {"kind", "code" (XIDs), "value", "meaning", "action", "node", "gpu", "since"}.
POD_GPU_FAULT: Final = PREFIX + "gpu-fault"

# Owner annotations (Deployment, ReplicaSet, StatefulSet, Job, JobSet, LeaderWorkerSet, Notebook)
# written when reclaimed, read by `gpu-efficiency restore` to undo it.
RECLAIMED: Final = PREFIX + "reclaimed"  # the action: ScaleToZero | Stop | Suspend
PREVIOUS_REPLICAS: Final = PREFIX + "previous-replicas"  # replicas before ScaleToZero
RECLAIMED_AT: Final = PREFIX + "reclaimed-at"  # RFC3339
RECLAIMED_BY: Final = PREFIX + "reclaimed-by"  # the policy's name
RECLAIM_REASON: Final = PREFIX + "reclaim-reason"  # why, in one sentence
#: horizontalpodautoscaler/NAME when an HPA targets the owner scaled to zero: it resumes on restore.
RECLAIMED_AUTOSCALER: Final = PREFIX + "autoscaler"
#: Every owner annotation the operator writes; restore removes exactly these.
OWNER_ANNOTATIONS: Final = (
    RECLAIMED,
    PREVIOUS_REPLICAS,
    RECLAIMED_AT,
    RECLAIMED_BY,
    RECLAIM_REASON,
    RECLAIMED_AUTOSCALER,
)
#: The Kubeflow notebook controller stops a Notebook (0 replicas) while this annotation is set.
KUBEFLOW_STOPPED: Final = "kubeflow-resource-stopped"

# Nodes.
FAULT_TAINT_KEY: Final = PREFIX + "gpu-fault"  # value: ecc | xid | thermal | straggler
GPU_HEALTHY: Final = "GPUHealthy"  # node condition type
GPU_DEGRADED: Final = "GPUDegraded"  # node condition type: True while a GPU is held as a hardware straggler
NODE_FAULTS: Final = PREFIX + "faults"  # node annotation: JSON record of faults the operator holds
FAULT_RECOVERED: Final = PREFIX + "fault-recovered"  # admin sets "ecc", "xid", "all" for manual recovery
XID_HISTORY: Final = PREFIX + "xid-history"  # node annotation: JSON of recent XID sightings per GPU and code

# DeviceTaintRules (single-GPU quarantine on DRA nodes): ours carry these labels and annotations.
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "gpu-efficiency-operator"
DEVICE_RULE_KIND_LABEL: Final = PREFIX + "fault-kind"  # ecc | xid | thermal
DEVICE_RULE_NODE: Final = PREFIX + "node"  # annotation: the node the device is on
DEVICE_RULE_GPU: Final = PREFIX + "gpu"  # annotation: the GPU's UUID

# Policy conditions.
COND_READY: Final = "Ready"
COND_METRICS: Final = "MetricsAvailable"
COND_BREAKER: Final = "CircuitBreakerOpen"
COND_VALID: Final = "PolicyValid"
COND_SHADOWED: Final = "Shadowed"  # True: an older policy judges some of the pods this one selects
COND_NOTIFY: Final = "NotificationsHealthy"  # False: a notification sink failed its last delivery
COND_SIGNALS: Final = "SignalsComplete"  # False: a fault kind or diagnosis input is blind for some GPUs
COND_STATUS_VALID: Final = "StatusValid"  # False: status fields read from the server were unreadable, dropped

# Event reasons.
EV_UNDERUTILIZED: Final = "GPUUnderutilized"
EV_IDLE: Final = "GPUIdle"
EV_EVICTION_SCHEDULED: Final = "GPUIdleEvictionScheduled"
EV_EVICTED: Final = "GPUIdleEvicted"
EV_EVICTION_BLOCKED: Final = "EvictionBlocked"
EV_ACTIVE_AGAIN: Final = "GPUActiveAgain"
EV_BOOKKEEPING_RESTORED: Final = "GPUIdleBookkeepingRestored"  # our idle annotations edited by others
EV_FAULT: Final = "GPUFaultDetected"
EV_TAINTED: Final = "NodeTainted"
EV_UNTAINTED: Final = "NodeUntainted"
EV_BREAKER: Final = "CircuitBreakerOpen"
EV_XID_INCIDENT: Final = "XidIncident"  # application XIDs on many nodes at once: one policy event, no taint
EV_DRAIN: Final = "GPUFaultDrain"  # a drain before a NoExecute fault taint began or ended (node, policy)
EV_DRAINED: Final = "GPUFaultEvicted"  # a pod evicted by that drain (pod)
EV_POD_GPU_FAULT: Final = "GPUFaultOnPod"  # the pod's GPU became faulty (Warning) or recovered (Normal)
EV_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
EV_POLICY_INVALID: Final = "PolicyInvalid"
EV_POLICY_SHADOWED: Final = "PolicyShadowed"  # Warning when the set of older policies winning pods changes
EV_RECLAIMED: Final = "GPUReclaimed"  # owner scaled to zero, stopped or suspended
EV_RESTORED: Final = "GPURestored"
EV_STRAGGLER: Final = "GPUStraggler"  # on the slow pod, its job's owner and (hardware cause) its node
EV_STRAGGLER_CLEARED: Final = "GPUStragglerCleared"  # the pod's GPUs caught up with their group
EV_RECLAIM_SKIPPED: Final = "ReclaimSkipped"  # partly idle owner, or Recommend by policy: recommendation only
EV_RECLAIM_INEFFECTIVE: Final = "ReclaimIneffective"  # evicted pods came back and idle again: left alone
EV_RECLAIM_REVERTED: Final = "ReclaimReverted"  # our reclaimed owner scaled back without restore: backed off
EV_NOTIFICATION_FAILED: Final = "NotificationFailed"  # a notification sink started failing
EV_SIGNALS_INCOMPLETE: Final = "SignalsIncomplete"  # Warning: the set of blind kinds/inputs changed
EV_SIGNALS_COMPLETE: Final = "SignalsComplete"  # every kind and input served again
EV_STATUS_FIELD_INVALID: Final = "StatusFieldInvalid"  # status fields dropped as unreadable (the rest kept)
EV_ACK_INVALID: Final = "AcknowledgementInvalid"  # keep-for/keep-until unreadable: ignored
EV_KEEP_CLICKED: Final = "GPUKeepRequested"  # a Keep for click (self-service page or Slack) wrote keep-for
EV_RELEASE_CLICKED: Final = "GPUReleaseRequested"  # a Release now click wrote release

#: Resource name of GPUs on nodes and in pod requests.
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
