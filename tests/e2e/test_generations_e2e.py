"""The core scenarios on every dcgm-exporter generation at once, and on a mixed fleet.

One scenario run per core scenario, one operator, one Prometheus target: the diagnosis scenario,
the ECC and the XID/thermal fault scenarios and the idle-reclaim scenario (``tests/e2e/scenarios/``)
are each copied side by side, once per generation (4.x, the simulator's default the files are written
for, then legacy, 4.8.3+, 4.9+) and once on a fleet whose nodes alternate 4.9+ and 4.x, each copy with
its own nodes, namespaces and workloads under the source's policies (one operator cycle per policy,
not per copy), and must give the same verdicts, taints and actions as the originals. A sixth copy plays the ECC
scenario on dcgm-exporter's default CSV, where no ECC counter is served: the node must not be
tainted, and the policy must say the ECC fault kind is blind (``SignalsComplete=False``) instead of
reading silence as health. Playing the copies side by side costs one run per scenario instead of
five (``make test`` budget).

The copies change names, and GPU counts where the source has GPUs it never uses (``GPUS``); what
each scenario checks stays the file's. Its PromQL ``metric`` expectations query the 4.x names and
label, so only the 4.x copy keeps them (with the copy's node names). The 4.x copy is how the core
scenarios are played at all: test_scenarios.py skips them (``CORE``), since playing each file again
alone would cost a whole scenario run (``make test`` budget).
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpu_efficiency.api.exporter_fields import Generation
from gpu_efficiency.api.policy.faults import CircuitBreaker
from gpu_efficiency.engine.quarantine.breaker import GpuCost, decide_taints, gpu_budget, taint_budget
from gpu_efficiency_sim.runner import RunOptions, run_scenario
from gpu_efficiency_sim.scenario import load_scenario
from tests.e2e.harness import Cluster, OperatorIdentity
from tests.e2e.scenario_driver import scenario_report

pytestmark = pytest.mark.e2e

SCENARIOS: Final = Path(__file__).parent / "scenarios"
#: The scenarios the matrix plays ("Matrices play the core scenarios, not every file").
CORE: Final = ("diagnoses.yaml", "ecc-fault.yaml", "xid-thermal.yaml", "idle-reclaim.yaml")
#: Copy tag -> the generations its nodes take in turn (node i of a scenario: gens[i % len]).
COPIES: Final[dict[str, tuple[Generation, ...]]] = {
    "g4": (Generation.V4,),  # the files as written (test_scenarios.py leaves CORE to this copy)
    "gl": (Generation.LEGACY,),
    "g483": (Generation.V4_8_3,),
    "g49": (Generation.V4_9,),
    "gmix": (Generation.V4_9, Generation.V4),  # half the nodes each; the faulted nodes 4.9+
}
#: GPUs of the copied nodes whose source has more than it ever uses (every policy's cycle reads every
#: GPU Prometheus holds, so idle spare GPUs cost each cycle): the pinned Job's 8 on ecc-gpu-0, the
#: faulted GPU's index on the XID/thermal nodes, the 11 one-GPU diagnosis pods on two nodes. The
#: healthy ECC and XID nodes keep enough that each copy's tainted GPUs stay within the source's
#: circuit breaker share (maxTaintedFraction 0.5, GPUs too): the copies share its budget, so a copy
#: over it would leave the last copy by name untainted (CircuitBreakerOpen).
GPUS: Final[dict[str, int]] = {
    "diag-gpu-0": 6,
    "diag-gpu-1": 6,
    "ecc-gpu-1": 3,
    "ecc-gpu-2": 3,
    "ecc-gpu-3": 3,
    "xid-gpu-0": 6,
    "xid-gpu-1": 1,
    "xid-gpu-2": 2,
    "xid-gpu-3": 3,
    "xid-gpu-4": 3,
    "xid-gpu-5": 3,
}
COPY_LABEL: Final = "sim.gpuefficiency.io/matrix-copy"
#: Framebuffer amounts of a 4.9+ GPU are of unknown unit to the operator (api/exporter_fields.py: DCGM
#: 4.6 says MB, dcgm-exporter 4.9's notes bytes), so it diagnoses no memory pressure there and says
#: the memory input is blind instead. On the mixed fleet the memory-pressure pod runs on a 4.x node.
MEMORY_PRESSURE_WORKLOAD: Final = "leaky"
#: The source scenario of a copied node or namespace: its policies select by it.
SCENARIO_LABEL: Final = "sim.gpuefficiency.io/matrix-scenario"
DEFAULT_CSV_TAG: Final = "gcsv"


def _renamed(tag: str) -> Callable[[str], str]:
    return lambda name: f"{tag}-{name}"


def copy_scenario(
    source: dict[str, Any], tag: str, generations: Sequence[Generation]
) -> dict[str, list[Any] | dict[str, Any]]:
    """``source``'s nodes, namespaces, workloads, faults and expectations renamed ``<tag>-<name>``
    (workloads ``<tag>-<scenario>-<name>``: two scenarios have a ``trainer``), its nodes served by
    ``generations`` in turn and labelled, with its namespaces, for the source's policies
    (``SCENARIO_LABEL``). Policies and their status checks are shared by the copies (``shared``)."""
    rename = _renamed(tag)
    rename_workload = _renamed(f"{tag}-{source['name'].split('-')[0]}")
    labels = {SCENARIO_LABEL: source["name"], COPY_LABEL: tag}
    nodes: list[dict[str, Any]] = []
    index = 0
    for spec in source["nodes"]:
        names = (
            [spec["name"]]
            if "name" in spec
            else [f"{spec['prefix']}{i}" for i in range(spec.get("count", 1))]
        )
        for name in names:
            node = {k: v for k, v in spec.items() if k not in ("name", "prefix", "count")}
            node["name"] = rename(name)
            node["gpus"] = GPUS.get(name, spec.get("gpus", 8))
            node["labels"] = {**spec.get("labels", {}), **labels}
            node["exporter"] = generations[index % len(generations)].value
            nodes.append(node)
            index += 1
    workloads = []
    namespaces: dict[str, Any] = {}
    for w in source.get("workloads", []):
        w = copy.deepcopy(w)
        w["name"] = rename_workload(w["name"])
        w["namespace"] = rename(w["namespace"])
        namespaces[w["namespace"]] = {"labels": dict(labels)}
        if "node" in w:
            w["node"] = rename(w["node"])
        elif w["name"] == rename_workload(MEMORY_PRESSURE_WORKLOAD) and Generation.V4_9 in generations:
            legible = [n["name"] for n in nodes if n["exporter"] != Generation.V4_9.value]
            if legible:
                w["node"] = legible[0]
        workloads.append(w)
    for ns, spec in source.get("namespaces", {}).items():
        spec = copy.deepcopy(spec or {})
        spec["labels"] = {**spec.get("labels", {}), **labels}
        namespaces[rename(ns)] = spec
    faults = []
    for f in source.get("faults", []):
        f = copy.deepcopy(f)
        if "node" in f:
            f["node"] = rename(f["node"])
        faults.append(f)
    expectations = []
    copy_nodes = [n["name"] for n in nodes]  # "<tag>-<source name>"
    for e in source.get("expectations", []):
        if "policyStatus" in e or ("metric" in e and tuple(generations) != (Generation.V4,)):
            continue
        e = copy.deepcopy(e)
        if "metric" in e:
            e["metric"]["query"] = _renamed_nodes_in(e["metric"]["query"], copy_nodes, tag)
        memory = (e.get("podAnnotation") or {}).get("workload") == MEMORY_PRESSURE_WORKLOAD
        if memory and all(g is Generation.V4_9 for g in generations):
            e = {
                "name": "memory pressure is not diagnosed from framebuffer amounts of unknown unit: "
                "the memory input is reported blind",
                "policyCondition": {"policy": "diagnoses", "type": "SignalsComplete", "status": "False"},
                "within": e["within"],
            }
        for key, check in e.items():
            if isinstance(check, dict):
                if "node" in check:
                    check["node"] = rename(check["node"])
                if "workload" in check:
                    old = check["workload"]
                    check["workload"] = rename_workload(old)
                    if key == "event" and "messageContains" in check:
                        check["messageContains"] = re.sub(
                            rf"/{re.escape(old)}\b", f"/{rename_workload(old)}", check["messageContains"]
                        )
        e["name"] = f"[{tag}] " + (e.get("name") or _summary(e))
        expectations.append(e)
    return {
        "nodes": nodes,
        "namespaces": namespaces,
        "workloads": workloads,
        "faults": faults,
        "expectations": expectations,
    }


def shared(source: dict[str, Any], tags: Sequence[str]) -> dict[str, dict[str, Any] | list[Any]]:
    """``source``'s policies, once for all copies: selecting the copies' namespaces and nodes by
    ``SCENARIO_LABEL`` (the operator runs every policy's cycle on one worker, so one policy per copy
    would multiply the cycles), with the copies' names in ``excludedNamespaces``; and its policy
    status checks with every count multiplied by the copies (each copy reclaims or evicts its own)."""
    policies = {}
    for name, spec in source.get("policies", {}).items():
        spec = copy.deepcopy(spec)
        selection = spec.setdefault("selection", {})
        selection["namespaceSelector"] = {"matchLabels": {SCENARIO_LABEL: source["name"]}}
        selection["nodeSelector"] = {"matchLabels": {SCENARIO_LABEL: source["name"]}}
        if "excludedNamespaces" in selection:
            selection["excludedNamespaces"] = [
                _renamed(tag)(ns) for ns in selection["excludedNamespaces"] for tag in tags
            ]
        policies[name] = spec
    expectations = []
    for e in source.get("expectations", []):
        if "policyStatus" not in e:
            continue
        e = copy.deepcopy(e)
        check = e["policyStatus"]
        for test in ("equals", "atLeast", "atMost"):
            if isinstance(check.get(test), int | float) and not isinstance(check[test], bool):
                check[test] = check[test] * len(tags)
        e["name"] = f"[{len(tags)} copies] " + (e.get("name") or _summary(e))
        expectations.append(e)
    return {"policies": policies, "expectations": expectations}


def _renamed_nodes_in(query: str, renamed: Sequence[str], tag: str) -> str:
    """A PromQL query with every quoted source node name (a label value) replaced by its copy's."""
    for name in renamed:
        query = query.replace(f'"{name.removeprefix(f"{tag}-")}"', f'"{name}"')
    return query


def _summary(e: dict[str, Any]) -> str:
    kind = next(k for k in e if k not in ("within", "after", "hold", "name"))
    return f"{kind} {e[kind]}"


def default_csv_ecc_copy() -> dict[str, list[Any] | dict[str, Any]]:
    """The ECC scenario on the default CSV: no taint ever, and the blind spot said, not hidden."""
    source = yaml.safe_load((SCENARIOS / "ecc-fault.yaml").read_text())
    parts = copy_scenario(source, DEFAULT_CSV_TAG, (Generation.DEFAULT_CSV,))
    node = f"{DEFAULT_CSV_TAG}-ecc-gpu-0"
    parts["expectations"] = [
        {
            "name": f"[{DEFAULT_CSV_TAG}] no ECC counter served: the injected fault taints nothing",
            "nodeNotTainted": {"node": node},
            "within": "90s",
        },
        {
            "name": f"[{DEFAULT_CSV_TAG}] silence is not health: the ECC kind is reported blind",
            "policyCondition": {"policy": source["name"], "type": "SignalsComplete", "status": "False"},
            "within": "60s",
        },
    ]
    return parts


def matrix_scenario(name: str) -> dict[str, Any]:
    """One core scenario copied onto every generation and the mixed fleet (and, for the ECC scenario,
    the default CSV), as one scenario: one run per source keeps each policy's cycle to the GPUs of one
    scenario's copies (a cycle reads every GPU Prometheus holds: 4 sources' copies at once made the
    one-worker cycle rounds longer than the sources' 30 s fault lookback)."""
    merged: dict[str, Any] = {
        "name": f"gen-{name.removesuffix('.yaml')}",
        "description": f"{name} on every dcgm-exporter generation and on a mixed fleet.",
        "nodes": [],
        "namespaces": {},
        "workloads": [],
        "faults": [],
        "policies": {},
        "expectations": [],
    }
    source = yaml.safe_load((SCENARIOS / name).read_text())
    parts = [copy_scenario(source, tag, gens) for tag, gens in COPIES.items()]
    ecc = name == "ecc-fault.yaml"
    parts.append(shared(source, [*COPIES, DEFAULT_CSV_TAG] if ecc else list(COPIES)))
    if ecc:
        parts.append(default_csv_ecc_copy())
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list):
                merged[key].extend(value)
            else:
                merged[key].update(value)
    return merged


@pytest.mark.parametrize("name", CORE)
def test_the_matrix_scenario_is_valid_and_keeps_every_operator_expectation(name: str, tmp_path: Path) -> None:
    path = tmp_path / "generations.yaml"
    path.write_text(yaml.safe_dump(matrix_scenario(name), sort_keys=False))
    scenario = load_scenario(path).scenario
    source = load_scenario(SCENARIOS / name).scenario
    kept = sum(e.kind not in ("metric", "policyStatus") for e in source.expectations)
    shared_checks = sum(e.kind == "policyStatus" for e in source.expectations)
    metrics = [e for e in source.expectations if e.kind == "metric"]  # the 4.x copy's alone
    extra = 2 if name == "ecc-fault.yaml" else 0
    assert len(scenario.expectations) == kept * len(COPIES) + shared_checks + len(metrics) + extra
    copied = [e.metric.query for e in scenario.expectations if e.metric is not None]
    assert copied == [  # on the 4.x copy's nodes
        re.sub(r'Hostname="([^"]+)"', r'Hostname="g4-\1"', e.metric.query)
        for e in metrics
        if e.metric is not None
    ]
    assert set(scenario.policies) == set(source.policies)
    mixed = [n.exporter for n in scenario.nodes if n.name and n.name.startswith("gmix-")]
    assert mixed.count(Generation.V4_9) >= mixed.count(Generation.V4) >= len(mixed) // 2


@pytest.mark.parametrize("name", CORE)
def test_the_shared_circuit_breaker_admits_every_copys_expected_taints(name: str) -> None:
    """The copies share each source policy, so its circuit breaker budgets all copies' GPUs at once:
    the taints every copy expects, held together, must fit it (the breaker picks by kind and name,
    so an overflow would leave the last copy, gmix, untainted with CircuitBreakerOpen)."""
    merged = matrix_scenario(name)
    capacity = {n["name"]: n["gpus"] for n in merged["nodes"]}  # every copy's node is in scope
    wishes: dict[str, set[str]] = {}
    for e in merged["expectations"]:
        if "nodeTainted" in e:
            check = e["nodeTainted"]
            wishes.setdefault(check["node"], set()).add(check.get("value", "ecc"))
    for policy, spec in merged["policies"].items():
        breaker = CircuitBreaker.model_validate((spec.get("faults") or {}).get("circuitBreaker") or {})
        decision = decide_taints(
            wishes,
            (),
            taint_budget(len(capacity), breaker),
            gpus={node: GpuCost(now=0, after=capacity[node]) for node in wishes},
            gpu_cap=gpu_budget(list(capacity.values()), breaker),
        )
        assert not decision.denied, f"{policy}: the shared breaker would hold {decision.denied}"


@pytest.mark.parametrize("name", CORE)
def test_core_scenarios_on_every_exporter_generation_and_a_mixed_fleet(
    name: str, cluster: Cluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    path = tmp_path / "generations.yaml"
    path.write_text(yaml.safe_dump(matrix_scenario(name), sort_keys=False))
    identity: OperatorIdentity = request.getfixturevalue("operator_identity")
    lines: list[str] = []
    result = run_scenario(
        path,
        RunOptions(
            kubeconfig=cluster.kubeconfig,
            prometheus_url=cluster.prometheus_url,
            targets_dir=cluster.prometheus_targets_dir(),
            operator_cmd=identity.run_command(cluster),
            operator_env={"KUBECONFIG": identity.kubeconfig},
            namespace_prefix=f"e2e-{uuid.uuid4().hex[:4]}-",
            log_dir=tmp_path,
            output=lines.append,
        ),
    )
    assert result.passed, scenario_report(lines, result)
