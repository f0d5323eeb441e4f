"""Which pods a policy judges: Kubernetes label selectors plus the scope and safety filters.

Protected namespaces are checked first and separately: the planner must not even annotate them.
Where policies overlap, the oldest judges the pod (``claimed_by``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.api.policy import LabelSelector, Selection
from gpu_efficiency.engine.model import NamespaceView, NodeView, PodView

LabelMatcher = Callable[[Mapping[str, str]], bool]


def _match_all(labels: Mapping[str, str]) -> bool:
    del labels
    return True


def compile_selector(selector: LabelSelector) -> LabelMatcher:
    """A predicate with Kubernetes semantics: matchLabels AND every matchExpression; empty matches all.

    In: key present with a listed value. NotIn: key absent or not listed. Exists / DoesNotExist: key
    presence. An unknown operator matches nothing (the API rejects it; failing closed is safer).
    """
    if not selector.match_labels and not selector.match_expressions:
        return _match_all
    required = tuple(selector.match_labels.items())
    expressions = tuple((e.key, e.operator, frozenset(e.values)) for e in selector.match_expressions)

    def matches(labels: Mapping[str, str]) -> bool:
        for key, value in required:
            if labels.get(key) != value:
                return False
        for key, operator, values in expressions:
            present = key in labels
            if operator == "In":
                ok = present and labels[key] in values
            elif operator == "NotIn":
                ok = not present or labels[key] not in values
            elif operator == "Exists":
                ok = present
            elif operator == "DoesNotExist":
                ok = not present
            else:
                ok = False
            if not ok:
                return False
        return True

    return matches


@dataclass(frozen=True, slots=True)
class Scope:
    """The policy's selection compiled once per cycle against this cycle's namespaces and nodes."""

    protected: frozenset[str]
    excluded: frozenset[str]
    namespace_ok: Mapping[str, bool]  # namespace name -> selector matched (unknown names: see below)
    namespace_unknown_ok: bool  # a namespace missing from the snapshot matches only an empty selector
    node_ok: Mapping[str, bool]
    node_unknown_ok: bool
    pod_matches: LabelMatcher

    def exclusion(self, pod: PodView) -> str:
        """Why the pod is out of scope, or '' when the policy judges it."""
        if pod.namespace in self.protected:
            return f"namespace {pod.namespace} is protected"
        if pod.namespace in self.excluded:
            return f"namespace {pod.namespace} is excluded by the policy"
        if pod.gpu_request <= 0:
            return "the pod requests no GPU"
        if pod.phase != "Running":
            return f"the pod is {pod.phase}, not Running"
        if pod.deleting:
            return "the pod is being deleted"
        if not self.namespace_ok.get(pod.namespace, self.namespace_unknown_ok):
            return f"namespace {pod.namespace} does not match the namespace selector"
        if not self.node_ok.get(pod.node, self.node_unknown_ok):
            return f"node {pod.node or '(none)'} does not match the node selector"
        if not self.pod_matches(pod.labels):
            return "the pod labels do not match the pod selector"
        return ""


def build_scope(
    selection: Selection,
    protected: Iterable[str],
    namespaces: Iterable[NamespaceView],
    nodes: Iterable[NodeView],
) -> Scope:
    """Evaluate the namespace and node selectors once per object, not once per pod."""
    ns_matches = compile_selector(selection.namespace_selector)
    node_matches = compile_selector(selection.node_selector)
    return Scope(
        protected=frozenset(protected),
        excluded=frozenset(selection.excluded_namespaces),
        namespace_ok={ns.name: ns_matches(ns.labels) for ns in namespaces},
        namespace_unknown_ok=ns_matches is _match_all,
        node_ok={node.name: node_matches(node.labels) for node in nodes},
        node_unknown_ok=node_matches is _match_all,
        pod_matches=compile_selector(selection.pod_selector),
    )


def claimed_by(pod: PodView, seniors: list[tuple[str, Scope]]) -> str:
    """Overlapping policies: the oldest (then by name) judges the pod, so annotations never flap.
    Returns that policy's name ('' when no senior selects the pod)."""
    for name, senior in seniors:
        if not senior.exclusion(pod):
            return name
    return ""
