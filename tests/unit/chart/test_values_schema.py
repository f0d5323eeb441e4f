"""Pure checks of the chart's values.yaml against values.schema.json (no helm needed).

Helm validates values with the same JSON Schema (draft-07), so a value rejected here is rejected by
`helm install`; tests/e2e/test_chart.py proves that end to end with the real helm binary.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import pytest
import yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "gpu-efficiency-operator"


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _errors(values: dict[str, Any]) -> list[jsonschema.ValidationError]:
    return list(jsonschema.Draft7Validator(_schema()).iter_errors(values))


def _with(path: str, value: Any) -> dict[str, Any]:
    """The default values with one dotted path set, like `helm --set path=value`."""
    values = copy.deepcopy(_values())
    node = values
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return values


def test_schema_is_valid_draft7() -> None:
    jsonschema.Draft7Validator.check_schema(_schema())


def test_default_values_are_valid() -> None:
    assert [e.message for e in _errors(_values())] == []


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        ("replicaCount", -1, "replicaCount", "less than the minimum"),
        ("replicaCount", "two", "replicaCount", "is not of type 'integer'"),
        ("metrics.port", "abc", "metrics.port", "is not of type 'integer'"),
        ("metrics.port", 70000, "metrics.port", "greater than the maximum"),
        ("health.port", 0, "health.port", "less than the minimum"),
        ("agent.port", 1.5, "agent.port", "is not of type 'integer'"),
        ("operator.logFormat", "xml", "operator.logFormat", "is not one of"),
        ("operator.logLevel", "verbose", "operator.logLevel", "is not one of"),
        ("image.pullPolicy", "Sometimes", "image.pullPolicy", "is not one of"),
        ("image.tag", "v1 beta", "image.tag", "does not match"),
        ("image.digest", "sha256:abc", "image.digest", "does not match"),
        ("policy.mode", "Enforcing", "policy.mode", "is not one of"),
        ("prometheus.url", "prometheus:9090", "prometheus.url", "does not match"),
        ("prometheus.refreshBudget", -1, "prometheus.refreshBudget", "less than the minimum"),
        ("agent.interval", "1 second", "agent.interval", "does not match"),
        ("agent.maxConnections", 0, "agent.maxConnections", "less than the minimum"),
        ("agent.requestTimeout", "soon", "agent.requestTimeout", "does not match"),
        ("agent.networkPolicy.enabled", "yes", "agent.networkPolicy.enabled", "is not of type 'boolean'"),
        (
            "agent.auth.readers",
            [{"kind": "Robot", "name": "x"}],
            "agent.auth.readers.0.kind",
            "is not one of",
        ),
        ("admissionPolicy.enabled", "on", "admissionPolicy.enabled", "is not of type 'boolean'"),
        ("agent.securityContext", {"privileged": True}, "agent.securityContext.privileged", "was expected"),
        ("tolerations", [{"key": "a", "effect": "NoWhere"}], "tolerations.0.effect", "is not one of"),
        ("metrics.serviceMonitor.interval", "often", "metrics.serviceMonitor.interval", "does not match"),
        (
            "prometheusRule.alerts.operatorDown.severity",
            "page",
            "prometheusRule.alerts.operatorDown.severity",
            "is not one of",
        ),
        ("resources", {"limits": {"memory": "lots"}}, "resources.limits.memory", "is not valid"),
    ],
)
def test_bad_value_is_rejected_naming_the_field(path: str, value: Any, field: str, message: str) -> None:
    errors = _errors(_with(path, value))
    assert errors, f"{path}={value!r} was accepted"
    found = {".".join(str(p) for p in e.absolute_path): e.message for e in errors}
    assert field in found, found
    assert message in found[field]


@pytest.mark.parametrize("path", ["replicaCount", "image", "prometheus.url", "metrics.port", "health.port"])
def test_required_value_missing_is_rejected(path: str) -> None:
    values = copy.deepcopy(_values())
    node = values
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    del node[leaf]
    errors = _errors(values)
    assert any(e.validator == "required" and repr(leaf) in e.message for e in errors), [
        e.message for e in errors
    ]


@pytest.mark.parametrize("path", ["replicaCuont", "metrics.prot", "agent.enable", "operator.leaderElections"])
def test_misspelled_key_is_rejected(path: str) -> None:
    errors = _errors(_with(path, 1))
    assert any(e.validator == "additionalProperties" and path.split(".")[-1] in e.message for e in errors)


def _strict_schema_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of properties declared under objects that forbid other keys."""
    paths: list[str] = []
    if schema.get("additionalProperties") is False:
        for key, sub in schema.get("properties", {}).items():
            path = f"{prefix}{key}"
            paths.append(path)
            paths.extend(_strict_schema_paths(sub, path + "."))
    return paths


def test_every_schema_property_has_a_default_in_values_yaml() -> None:
    """The schema and values.yaml describe the same tree: nothing configurable lacks a default."""
    values = _values()
    missing = []
    for path in _strict_schema_paths(_schema()):
        if path == "global":
            continue
        node: Any = values
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                missing.append(path)
                break
            node = node[key]
    assert missing == []


def test_every_schema_property_has_a_description() -> None:
    def walk(schema: dict[str, Any], prefix: str) -> list[str]:
        out = []
        for key, sub in schema.get("properties", {}).items():
            if key != "privileged" and "description" not in sub:
                out.append(prefix + key)
            out.extend(walk(sub, prefix + key + "."))
        return out

    assert walk(_schema(), "") == []


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_./-]+):(?:\s|$)")


def test_every_value_is_documented() -> None:
    """Each leaf key of values.yaml has a comment above it, or sits inside a value documented with `# --`.

    Group keys (mappings whose keys are listed below them) need no comment of their own.
    """
    keys: list[tuple[int, str, str]] = []  # (indent, key, first line of the comment block above, or "")
    comment = ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        text = line.strip()
        match = _KEY.match(line)
        if match is not None:
            keys.append((len(match["indent"]), match["key"], comment))
        if text.startswith("#"):
            comment = comment or text
        elif text:
            comment = ""
    undocumented = []
    stack: list[tuple[int, bool]] = []  # (indent, documented with "# --" here or above)
    for n, (indent, key, above) in enumerate(keys):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        inherited = any(doc for _, doc in stack)
        is_group = n + 1 < len(keys) and keys[n + 1][0] > indent
        if not (is_group or inherited or above.startswith("#")):
            undocumented.append(key)
        stack.append((indent, inherited or above.startswith("# --")))
    assert undocumented == []


def test_chart_crds_match_the_generated_crds() -> None:
    """The chart ships a copy of crds/ (`make crds` refreshes both); a stale copy installs an old schema."""
    source = CHART.parents[1] / "crds"
    generated = {p.name: p.read_text() for p in source.glob("*.yaml")}
    packaged = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert generated, f"no CRDs in {source}"
    assert packaged == generated, "run `make crds` to copy crds/*.yaml into the chart"
