"""The committed CRD must be exactly what the models generate, and the schema must be structural."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_efficiency.api.crd import CRD_FILENAME, build_crd, render_crd

ROOT = Path(__file__).resolve().parents[3]


def test_committed_crd_matches_models() -> None:
    committed = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert committed == render_crd(), "crds/ drifted from the models: run `make crds`"


def test_chart_crd_matches_models() -> None:
    chart_crd = ROOT / "charts" / "gpu-efficiency-operator" / "crds" / CRD_FILENAME
    if not chart_crd.exists():
        pytest.fail(f"{chart_crd} missing: the chart must ship the generated CRD")
    assert chart_crd.read_text() == render_crd(), "chart CRD drifted: run `make crds`"


def _walk(node: Any, path: str = "") -> list[str]:
    problems = []
    if isinstance(node, dict):
        for forbidden in ("$ref", "anyOf", "allOf", "title", "$defs"):
            if forbidden in node and path.count("x-kubernetes-validations") == 0:
                problems.append(f"{path}: {forbidden}")
        if node.get("additionalProperties") is False:
            problems.append(f"{path}: additionalProperties false")
        for key, value in node.items():
            problems += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            problems += _walk(value, f"{path}[{i}]")
    return problems


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []


def test_every_spec_field_has_a_description() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing: list[str] = []

    def visit(node: dict[str, Any], path: str) -> None:
        for name, prop in node.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{path}.{name}")
            visit(prop, f"{path}.{name}")
            if "items" in prop:
                visit(prop["items"], f"{path}.{name}[]")

    visit(schema, "spec")
    assert missing == []


def test_defaults_round_trip_through_yaml() -> None:
    doc = yaml.safe_load(render_crd())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["mode"]["default"] == "Observe"
    assert spec["properties"]["idle"]["default"] == {}
    assert doc["spec"]["scope"] == "Cluster"
    assert doc["spec"]["names"]["shortNames"] == ["gep"]


def test_readme_policy_reference_is_current() -> None:
    from tests.unit.user_docs import POLICY_REFERENCE

    from gpu_efficiency.api.reference import update_readme

    page = POLICY_REFERENCE.read_text()
    assert update_readme(page) == page, "docs/policies.md's policy reference drifted: run `make docs`"


def _spec_schema() -> dict[str, Any]:
    spec: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    return spec


@pytest.mark.parametrize(
    ("path", "own_words"),
    [
        (("idle", "idleFor"), "idle"),
        (("idle", "warningPeriod"), "warn"),
        (("window",), "window"),
        (("faults", "thermal", "recoveryAfter"), "healthy"),
    ],
)
def test_duration_fields_keep_their_own_description_and_the_format_note(
    path: tuple[str, ...], own_words: str
) -> None:
    node = _spec_schema()
    for name in path:
        node = node["properties"][name]
    description = node["description"]
    assert description.endswith("A Go-style duration such as 30s, 5m or 1h30m.")
    assert description != "A Go-style duration such as 30s, 5m or 1h30m."
    assert own_words in description.lower()


def test_conditions_are_a_map_keyed_by_type_with_date_time_transitions() -> None:
    status = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]
    item = conditions["items"]["properties"]
    assert item["lastTransitionTime"]["format"] == "date-time"
    assert "default" not in item["lastTransitionTime"]
    assert item["observedGeneration"]["type"] == "integer"


def test_kubectl_get_shows_reclaims_and_gpu_hours_returned_from_real_status_fields() -> None:
    """Enforce mostly reclaims owners: an Evicted column alone read 0 after a week of scaled-down
    Deployments. Every column must read a field the status model really has."""
    crd = build_crd()
    (version,) = crd["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Reclaimed"] == ".status.reclaimsTotal"
    assert columns["GPU-h Returned"] == ".status.gpuHoursReturned"
    assert columns["Evicted"] == ".status.evictionsTotal"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for name, path in columns.items():
        if path.startswith(".status.") and "[" not in path:
            assert path.removeprefix(".status.") in status, name


def test_the_mode_description_says_what_enforce_does_per_owner_kind() -> None:
    (version,) = build_crd()["spec"]["versions"]
    mode = " ".join(
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["mode"][
            "description"
        ].split()
    )
    for words in (
        "scaled to zero",
        "Jobs and JobSets suspended",
        "Notebooks stopped",
        "allowBarePods",
        "restore",
    ):
        assert words in mode, words
    assert "evicts idle pods" not in mode
