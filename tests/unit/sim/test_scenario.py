"""The scenario format: shipped files validate, broken ones are rejected with located messages."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpu_efficiency_sim.faults import FaultKind
from gpu_efficiency_sim.playbook import sim_faults, sim_nodes, workload_plays
from gpu_efficiency_sim.scenario import ScenarioError, json_schema, load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "e2e" / "scenarios"
MINIMAL = """
nodes:
  - name: n0
workloads:
  - name: w
    namespace: ns
"""


def problems(text: str, tmp_path: Path | None = None) -> list[str]:
    path = (tmp_path or Path("/nonexistent")) / "s.yaml"
    with pytest.raises(ScenarioError) as info:
        parse_scenario(textwrap.dedent(text), path)
    assert str(path) in str(info.value)
    return info.value.problems


@pytest.mark.parametrize("path", sorted(p.name for p in SCENARIOS.glob("*.yaml")))
def test_shipped_scenarios_are_valid(path: str) -> None:
    loaded = load_scenario(SCENARIOS / path)
    assert loaded.scenario.expectations, "a shipped scenario checks something"
    assert loaded.name == loaded.scenario.name


def test_shipped_scenarios_use_distinct_node_names() -> None:
    names = [n for p in SCENARIOS.glob("*.yaml") for n in load_scenario(p).scenario.node_names]
    assert len(names) == len(set(names)), "scenarios must be able to run side by side"


def test_the_malformed_example_reports_every_problem_with_its_line() -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(SCENARIOS / "bad" / "malformed.yaml")
    text = str(info.value)
    assert "malformed.yaml: invalid scenario" in text
    assert "workloads[0].profile (line 11): unknown profile 'idel'" in text
    assert "workloads[0].replicas (line 12)" in text
    assert "faults[0].at (line 14): invalid duration 'soon'" in text
    assert "expectations[0].colour (line 20): Extra inputs are not permitted" in text


def test_the_false_expectation_example_is_valid() -> None:
    loaded = load_scenario(SCENARIOS / "bad" / "false-expectation.yaml")
    assert loaded.scenario.needs_operator is False


def test_minimal_scenario_defaults() -> None:
    s = parse_scenario(MINIMAL).scenario
    w = s.workloads[0]
    assert (w.kind, w.replicas, w.gpus, w.profile, w.image) == (
        "Deployment",
        1,
        1,
        "idle",
        "registry.k8s.io/pause:3.10",
    )
    assert s.nodes[0].gpus == 8
    assert s.nodes[0].gpu_model.product == "NVIDIA-H100-80GB-HBM3"
    assert s.simulator.pod_labels == "standard"
    assert s.simulator.sm_active is True


def test_node_prefix_and_count_expand() -> None:
    s = parse_scenario("nodes: [{prefix: gpu-, count: 3, gpus: 4, model: NVIDIA A100-SXM4-80GB}]").scenario
    assert s.node_names == ["gpu-0", "gpu-1", "gpu-2"]
    assert [n.model.product for n in sim_nodes(s)] == ["NVIDIA-A100-SXM4-80GB"] * 3


def test_yaml_syntax_errors_name_line_and_column() -> None:
    found = problems("nodes:\n  - name: n0\n   bad: [\n")
    assert found[0].startswith("line ")
    assert "not valid YAML" in found[0]


def test_a_document_that_is_not_a_mapping() -> None:
    assert "a scenario is a mapping" in problems("- just\n- a list\n")[0]


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("nodes: []", "nodes"),
        ("nodes: [{name: n0, prefix: p}]", "give exactly one of name or prefix"),
        ("nodes: [{name: n0, model: GTX-1080}]", "unknown GPU model 'GTX-1080'"),
        ("nodes: [{name: n0}, {name: n0}]", "duplicate node names n0"),
        (MINIMAL + "    node: elsewhere", "'elsewhere' is not a scenario node"),
        (MINIMAL + "    kind: Pod\n    replicas: 2", "kind Pod has exactly one replica"),
        (MINIMAL + "    timeline: [{at: 1s, values: {DCGM_FI_NOPE: 1}}]", "unknown metric(s) DCGM_FI_NOPE"),
        (MINIMAL + "faults: [{at: 1s, kind: xid, node: n0}]", "xid needs an integer value"),
        (MINIMAL + "faults: [{at: 1s, kind: ecc}]", "ecc needs a node"),
        (MINIMAL + "faults: [{at: 1s, kind: ecc, node: n0, gpu: 8}]", "node n0 has GPUs 0-7"),
        (MINIMAL + "faults: [{at: 1s, kind: exporter-down, node: n0}]", "no node or gpu"),
        (MINIMAL + "faults: [{at: 1s, kind: garbage, value: zero}]", "garbage value must be one of"),
        (
            MINIMAL + "faults: [{at: 1s, kind: clock-events, node: n0, value: [too-hot]}]",
            "unknown clock-event bit",
        ),
        (
            MINIMAL + "faults: [{at: 1s, kind: xid, node: n9, value: 79}]",
            "faults[0].node (line 7): 'n9' is not a scenario node",
        ),
        (MINIMAL + "expectations: [{within: 1s}]", "give exactly one check"),
        (
            MINIMAL + "expectations: [{within: 1s, podEvicted: {workload: w}, nodeTainted: {node: n0}}]",
            "found podEvicted, nodeTainted",
        ),
        (
            MINIMAL + "expectations: [{within: 9s, podEvicted: {workload: x}}]",
            "'x' is not a scenario workload",
        ),
        (
            MINIMAL + "expectations: [{within: 9s, after: 10s, podEvicted: {workload: w}}]",
            "after must not be later",
        ),
        (
            MINIMAL + "expectations: [{within: 9s, event: {reason: X}}]",
            "exactly one of workload, node or policy",
        ),
        (
            MINIMAL
            + "expectations: [{within: 9s, policyCondition: {policy: p, type: Ready, status: 'True'}}]",
            "'p' is not a scenario policy",
        ),
        (
            MINIMAL + "expectations: [{within: 9s, podAnnotation: {workload: w, key: k}}]",
            "give exactly one of equals",
        ),
        (MINIMAL + "faults: [{at: 0s, kind: pcie-link, node: n0, value: x3}]", "pcie-link value must be"),
        (MINIMAL + "policies: {p: {mode: Sometimes}}", "policies.p.mode"),
        (MINIMAL + "policies: {p: {interval: 60s, window: 10s}}", "window must be at least interval"),
    ],
)
def test_bad_scenarios_are_rejected_with_the_place_and_the_problem(snippet: str, expected: str) -> None:
    found = "\n".join(problems(snippet))
    assert expected in found, found


def test_cross_reference_errors_point_at_the_line() -> None:
    found = problems(MINIMAL + "    node: elsewhere\n")
    assert found == ["workloads[0].node (line 7): 'elsewhere' is not a scenario node"]


def test_policies_from_files_manifest_or_bare_spec(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "manifest.yaml").write_text(
        "apiVersion: gpuefficiency.io/v1alpha1\nkind: GPUEfficiencyPolicy\nmetadata: {name: x}\n"
        "spec: {mode: Enforce, interval: 5s, window: 60s}\n"
    )
    (tmp_path / "bare.yaml").write_text("mode: Observe\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        MINIMAL + "policies:\n  a: {file: policies/manifest.yaml}\n  b: {file: bare.yaml}\n  c: {}\n"
    )
    loaded = load_scenario(scenario)
    assert loaded.policies == {
        "a": {"mode": "Enforce", "interval": "5s", "window": "60s"},
        "b": {"mode": "Observe"},
        "c": {},
    }


def test_bad_policy_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("mode: Enforce\nidle: {idleFor: forever}\n")
    found = "\n".join(
        problems(MINIMAL + "policies:\n  a: {file: bad.yaml}\n  b: {file: missing.yaml}\n", tmp_path)
    )
    assert "policies.a['file bad.yaml'].idle.idleFor" in found
    assert "policies.b.file: cannot read" in found


def test_sim_inputs_from_a_scenario() -> None:
    s = parse_scenario(
        MINIMAL
        + "    profile: idle\n    profileChanges: [{at: 90s, profile: compute-bound}]\n"
        + "faults:\n  - {at: 1m, kind: clock-events, node: n0, duration: 30s,\n"
        + "     value: [sw-thermal, hw-slowdown]}\n"
    ).scenario
    (play,) = workload_plays(s, "pre-")
    assert (play.namespace, play.profile_at(89), play.profile_at(90)) == ("pre-ns", "idle", "compute-bound")
    (fault,) = sim_faults(s)
    assert (fault.kind, fault.at, fault.duration, fault.value) == (FaultKind.CLOCK_EVENTS, 60.0, 30.0, 0x28)


def test_json_schema_describes_the_format_and_the_inline_policy_spec() -> None:
    schema = json_schema()
    json.dumps(schema)
    assert {"nodes", "workloads", "faults", "policies", "expectations", "simulator"} <= set(
        schema["properties"]
    )
    assert schema["required"] == ["nodes"]
    assert "GPUEfficiencyPolicySpec" in schema["$defs"]
    refs = json.dumps(schema["properties"]["policies"])
    assert "#/$defs/PolicyFile" in refs
    assert "#/$defs/GPUEfficiencyPolicySpec" in refs


def test_namespaces_are_listed_once_however_many_workloads_share_one() -> None:
    """The demo's live view lists pods and events per namespace: a namespace named twice showed
    every pod and event twice."""
    demo = load_scenario(
        Path(__file__).resolve().parents[3] / "harness/gpu_efficiency_sim/scenarios/demo.yaml"
    )
    names = demo.scenario.namespace_names
    assert len(names) == len(set(names))
    assert {"demo-research", "demo-training", "demo-serving"} <= set(names)


def test_a_workload_can_start_later_and_a_bad_start_is_located() -> None:
    s = parse_scenario(MINIMAL + "    startAt: 10s\n").scenario
    assert s.workloads[0].start_at == "10s"
    assert parse_scenario(MINIMAL).scenario.workloads[0].start_at is None
    (problem,) = problems(MINIMAL + "    startAt: later\n")
    assert "workloads[0].startAt" in problem
    assert "invalid duration 'later'" in problem


def test_a_dra_node_cannot_be_time_sliced() -> None:
    (problem,) = problems("nodes: [{name: n0, dra: true, timeSlicing: 2}]\n")
    assert "timeSlicing is the device plugin's" in problem
