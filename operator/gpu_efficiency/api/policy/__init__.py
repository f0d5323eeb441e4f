"""Pydantic models of the GPUEfficiencyPolicy spec: the single source of the CRD schema.

Field docstrings become CRD descriptions (see ``api/crd.py``), so they are written for cluster
admins reading ``kubectl explain gep.spec``. One module per section of the spec (base.py: the
CRD's identity and the model base; spec.py: the top level); this package re-exports every name, so
callers import from ``gpu_efficiency.api.policy``.
"""

from __future__ import annotations

from gpu_efficiency.api.policy.base import (
    ALWAYS_PROTECTED_NAMESPACES,
    DURATION_NOTE,
    DURATION_PATTERN,
    GROUP,
    KIND,
    PLURAL,
    PREFIX,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    Duration,
    Model,
)
from gpu_efficiency.api.policy.faults import (
    DEFAULT_CRITICAL_XIDS,
    DEFAULT_IGNORED_XIDS,
    DEFAULT_TAINT_CLASSES,
    CircuitBreaker,
    DeviceQuarantine,
    DeviceTaintEffect,
    EccFault,
    FaultEffect,
    FaultKindBase,
    FaultRules,
    PcieFault,
    Recovery,
    ThermalFault,
    XidFault,
    XidRepeat,
    XidResolution,
)
from gpu_efficiency.api.policy.metrics import (
    PROMETHEUS_URL_PATTERN,
    MetricsSource,
    PrometheusSource,
)
from gpu_efficiency.api.policy.notify import (
    DEFAULT_NOTIFY_REASONS,
    NotifyReason,
    NotifySink,
    SinkType,
)
from gpu_efficiency.api.policy.reclaim import (
    EvictionBudget,
    IdleRule,
    OwnerActions,
    ReclaimAction,
    ReclaimRule,
    ReclaimWhen,
)
from gpu_efficiency.api.policy.selection import (
    LabelSelector,
    LabelSelectorRequirement,
    Selection,
)
from gpu_efficiency.api.policy.spec import (
    GPUEfficiencyPolicySpec,
    Mode,
)
from gpu_efficiency.api.policy.stragglers import (
    StragglerRule,
)
from gpu_efficiency.api.policy.underutilization import (
    UnderutilizationRule,
)

__all__ = [
    "ALWAYS_PROTECTED_NAMESPACES",
    "DEFAULT_CRITICAL_XIDS",
    "DEFAULT_IGNORED_XIDS",
    "DEFAULT_NOTIFY_REASONS",
    "DEFAULT_TAINT_CLASSES",
    "DURATION_NOTE",
    "DURATION_PATTERN",
    "GROUP",
    "KIND",
    "PLURAL",
    "PREFIX",
    "PROMETHEUS_URL_PATTERN",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "CircuitBreaker",
    "DeviceQuarantine",
    "DeviceTaintEffect",
    "Duration",
    "EccFault",
    "EvictionBudget",
    "FaultEffect",
    "FaultKindBase",
    "FaultRules",
    "GPUEfficiencyPolicySpec",
    "IdleRule",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MetricsSource",
    "Mode",
    "Model",
    "NotifyReason",
    "NotifySink",
    "OwnerActions",
    "PcieFault",
    "PrometheusSource",
    "ReclaimAction",
    "ReclaimRule",
    "ReclaimWhen",
    "Recovery",
    "Selection",
    "SinkType",
    "StragglerRule",
    "ThermalFault",
    "UnderutilizationRule",
    "XidFault",
    "XidRepeat",
    "XidResolution",
]
