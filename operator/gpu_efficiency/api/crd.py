"""Generate the GPUEfficiencyPolicy CRD from the pydantic models.

The models are the single source of truth: ``crds/`` is regenerated with
``gpu-efficiency crd > crds/gpuefficiency.io_gpuefficiencypolicies.yaml`` and a unit test fails when
the committed file drifts. Kubernetes needs a *structural* schema, so ``$ref`` is inlined, ``title``
dropped and ``anyOf [X, null]`` turned into ``nullable``.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from gpu_efficiency.api.policy import (
    DURATION_NOTE,
    DURATION_PATTERN,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    GPUEfficiencyPolicySpec,
)
from gpu_efficiency.api.policy.spec import MIN_INTERVAL_S, WINDOW_SCRAPES
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus

CRD_FILENAME = f"{GROUP}_{PLURAL}.yaml"

#: Cross-field rules the API server enforces (CEL); each mirrors a check in the pydantic model.
SPEC_CEL_RULES: list[dict[str, str]] = [
    {
        "rule": f"!has(self.interval) || duration(self.interval) >= duration('{MIN_INTERVAL_S:.0f}s')",
        "message": f"interval must be at least {MIN_INTERVAL_S:.0f}s (cycles are never closer)",
    },
    {
        "rule": "!has(self.metrics) || !has(self.metrics.prometheus) || "
        "!has(self.metrics.prometheus.scrapeInterval) || "
        "duration(self.metrics.prometheus.scrapeInterval) > duration('0s')",
        "message": "metrics.prometheus.scrapeInterval must be longer than 0s",
    },
    {
        "rule": "!has(self.window) || !has(self.metrics) || !has(self.metrics.prometheus) || "
        "!has(self.metrics.prometheus.scrapeInterval) || duration(self.window).getMilliseconds() >= "
        f"{WINDOW_SCRAPES} * duration(self.metrics.prometheus.scrapeInterval).getMilliseconds()",
        "message": f"window must be at least {WINDOW_SCRAPES} x metrics.prometheus.scrapeInterval "
        "(fewer samples make every GPU Unknown)",
    },
    {
        "rule": "!has(self.metrics) || !has(self.metrics.prometheus) || "
        "!has(self.metrics.prometheus.scrapeInterval) || !has(self.metrics.prometheus.maxStaleness) || "
        "duration(self.metrics.prometheus.maxStaleness) >= duration(self.metrics.prometheus.scrapeInterval)",
        "message": "metrics.prometheus.maxStaleness must be at least scrapeInterval",
    },
    {
        "rule": "!has(self.metrics) || !has(self.metrics.prometheus) || "
        "!has(self.metrics.prometheus.queryTimeout) || "
        "duration(self.metrics.prometheus.queryTimeout) > duration('0s')",
        "message": "metrics.prometheus.queryTimeout must be longer than 0s",
    },
    {
        "rule": "!has(self.mode) || self.mode != 'Enforce' || !has(self.idle) || "
        "(has(self.idle.enabled) && !self.idle.enabled) || !has(self.idle.warningPeriod) || "
        "duration(self.idle.warningPeriod) > duration('0s')",
        "message": "idle.warningPeriod must be longer than 0s in Enforce (a warning before every reclaim)",
    },
    {
        "rule": "!has(self.window) || !has(self.interval) || duration(self.window) >= duration(self.interval)",
        "message": "window must be at least interval",
    },
    {
        "rule": "!has(self.underutilization) || !has(self.underutilization.noTensorSmActiveMin) || "
        "!has(self.underutilization.noTensorSmActiveMax) || "
        "self.underutilization.noTensorSmActiveMin <= self.underutilization.noTensorSmActiveMax",
        "message": "underutilization.noTensorSmActiveMin must not exceed noTensorSmActiveMax",
    },
    {
        "rule": "!has(self.pricePerGpuHour) || self.pricePerGpuHour.all(k, self.pricePerGpuHour[k] >= 0.0)",
        "message": "pricePerGpuHour values must be non-negative",
    },
    {
        "rule": "!has(self.faults) || !has(self.faults.xid) || !has(self.faults.xid.critical) || "
        "!has(self.faults.xid.ignored) || !self.faults.xid.critical.exists(c, c in self.faults.xid.ignored)",
        "message": "faults.xid: a code cannot be both critical and ignored",
    },
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {
        "name": "Metrics",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="MetricsAvailable")].status',
    },
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpusEvaluated"},
    {"name": "Idle", "type": "integer", "jsonPath": ".status.idleGpus"},
    {"name": "Warned", "type": "integer", "jsonPath": ".status.warnedPods", "priority": 1},
    # Enforce mostly reclaims owners (scale to zero, suspend, stop) rather than evicting pods: both
    # counts, and the GPU-hours those reclaims gave back, so a week of Enforce never reads "0 evicted".
    {"name": "Reclaimed", "type": "integer", "jsonPath": ".status.reclaimsTotal"},
    {"name": "Evicted", "type": "integer", "jsonPath": ".status.evictionsTotal"},
    {"name": "GPU-h Returned", "type": "number", "jsonPath": ".status.gpuHoursReturned"},
    {"name": "Waste/h", "type": "number", "jsonPath": ".status.estimatedWastePerHour"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and make the schema structural, recursively."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **extra}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties":
            out[key] = {name: _inline(prop, defs) for name, prop in value.items()}
        else:
            out[key] = _inline(value, defs)
    variants = out.get("anyOf")
    if isinstance(variants, list):
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) == 1 and len(variants) == 2:
            del out["anyOf"]
            out = {**non_null[0], **out, "nullable": True}
            if out.get("default", 0) is None:
                del out["default"]
    if out.get("pattern") == DURATION_PATTERN:
        out["description"] = f"{out.get('description', '')} {DURATION_NOTE}".strip()
    if out.get("additionalProperties") is False:
        # Not allowed beside properties in a structural schema; the API server's strict field
        # validation (kubectl's default) rejects unknown fields instead.
        del out["additionalProperties"]
    return out


def _default_nested_objects(schema: dict[str, Any]) -> None:
    """Give optional object properties ``default: {}`` so the API server fills their inner defaults."""
    for prop in schema.get("properties", {}).values():
        if prop.get("type") == "object" and "properties" in prop:
            prop.setdefault("default", {})
            _default_nested_objects(prop)


def _conditions_schema(status_schema: dict[str, Any]) -> None:
    """Conditions as Kubernetes conventions declare them: a map keyed by type (so a server-side
    apply or strategic merge treats each condition on its own) and RFC3339 transition times."""
    conditions = status_schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    transition = conditions["items"]["properties"]["lastTransitionTime"]
    transition.pop("default", None)  # '' is no date-time; the operator always sets it
    transition["format"] = "date-time"


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a pydantic model, with wire (camelCase) names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _inline(raw, defs)
    return schema


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec_schema = openapi_schema(GPUEfficiencyPolicySpec)
    _default_nested_objects(spec_schema)
    spec_schema["x-kubernetes-validations"] = SPEC_CEL_RULES
    # sink names are unique (the model's check, enforced by the API server as a map keyed by name)
    notify = spec_schema["properties"]["notify"]
    notify["x-kubernetes-list-type"] = "map"
    notify["x-kubernetes-list-map-keys"] = ["name"]
    status_schema = openapi_schema(GPUEfficiencyPolicyStatus)
    _conditions_schema(status_schema)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True  # Kopf keeps its own bookkeeping here
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "gpu-efficiency-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["gpuefficiency"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A GPUEfficiencyPolicy tells the operator which GPU pods and nodes "
                            "to watch, how to judge their real activity, and what it may do about idle GPUs "
                            "and GPU faults. Cluster-scoped: only cluster admins create policies.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {**spec_schema, "default": {}},
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML committed under crds/."""
    header = "# Generated by `gpu-efficiency crd` from gpu_efficiency/api; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
