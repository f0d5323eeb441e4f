"""Which pods and nodes a policy looks at: Kubernetes label selectors and excluded namespaces."""

from __future__ import annotations

from pydantic import Field, model_validator

from gpu_efficiency.api.policy.base import Model


class LabelSelectorRequirement(Model):
    key: str
    """The label key the selector applies to."""
    operator: str = Field(pattern=r"^(In|NotIn|Exists|DoesNotExist)$")
    """In, NotIn, Exists or DoesNotExist."""
    values: list[str] = Field(default_factory=list)
    """Values for In and NotIn; empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        """Kubernetes' own rule for selectors, which OpenAPI cannot express (reported in status)."""
        needs_values = self.operator in ("In", "NotIn")
        if needs_values and not self.values:
            raise ValueError(f"matchExpressions: operator {self.operator} on key {self.key!r} needs values")
        if not needs_values and self.values:
            raise ValueError(
                f"matchExpressions: operator {self.operator} on key {self.key!r} takes no values"
            )
        return self


class LabelSelector(Model):
    """A Kubernetes label selector; an empty selector matches everything."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels that must all be present with these values."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)
    """Set-based requirements that must all hold."""


class Selection(Model):
    """Which pods and nodes the policy looks at."""

    namespace_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Namespaces whose labels match are in scope (empty: all namespaces)."""
    pod_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Pods whose labels match are in scope (empty: all pods requesting GPUs)."""
    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    """Nodes whose labels match are in scope, for pods and faults (empty: all GPU nodes)."""
    excluded_namespaces: list[str] = Field(default_factory=list, max_length=256)
    """Namespaces never touched, on top of kube-system, kube-public, kube-node-lease and the operator's own."""
