"""One catalogue: GPU models are defined only in ``gpu_models.MODELS`` and workload profiles only in
``profiles.PROFILES``; the simulator, the fake NVML and the node manifests derive from them.

A second table drifts from the first (the fake NVML once had its own profiles in other units and its
own default model), so any Python module of the product, the harness or the benchmarks that defines
one fails here: a collection literal naming two or more catalogue models, a dict keyed by two or more
profile names, or a module-level constant that is a model's name. Tests are not scanned: they name
models as test data and key expectations by profile. Shell scripts (hack/localcluster/cluster.sh)
get their fake GPU nodes from ``gpu-efficiency-sim node-manifests`` and may name no model or memory
size.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from gpu_efficiency_sim import gpu_models, profiles
from gpu_efficiency_sim.gpu_models import MODELS
from gpu_efficiency_sim.profiles import PROFILES

REPO = Path(__file__).resolve().parents[3]
SCANNED = ("operator", "harness", "bench")
CATALOGUE = {Path(gpu_models.__file__).resolve(), Path(profiles.__file__).resolve()}
MODEL_NAMES = {m.model_name for m in MODELS} | {m.product for m in MODELS}


def _strings(nodes: list[ast.expr | None]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _nested_strings(nodes: list[ast.expr | None]) -> set[str]:
    """The strings anywhere inside ``nodes``: a table of rows names one model per row."""
    return _strings([d for n in nodes if n is not None for d in ast.walk(n) if isinstance(d, ast.expr)])


def tables(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) of every model or profile table, and every model-name constant, in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict | ast.List | ast.Tuple | ast.Set):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            models = _nested_strings(list(items)) & MODEL_NAMES
            if isinstance(node, ast.Dict):
                models |= _nested_strings(list(node.values)) & MODEL_NAMES
            if len(models) >= 2:
                yield node.lineno, f"a table of GPU models {sorted(models)}"
            if isinstance(node, ast.Dict) and len(_strings(list(node.keys)) & set(PROFILES)) >= 2:
                yield node.lineno, "a table of workload profiles"
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Constant) and value.value in MODEL_NAMES:
            yield stmt.lineno, f"a GPU model constant {value.value!r}"


def test_tables_find_what_they_look_for() -> None:
    source = 'M = "NVIDIA L4"\nT = ("NVIDIA-H200", "Tesla T4")\nP = {"idle": 1, "fake-load": 2}\n'
    assert sorted(line for line, _ in tables(ast.parse(source))) == [1, 2, 3]
    rows = (
        'R = (\n  ("NVIDIA-H100-80GB-HBM3", "81559", "hopper"),\n  ("NVIDIA-A100-SXM4-80GB", "81920"),\n)\n'
    )
    assert [line for line, _ in tables(ast.parse(rows))] == [1]
    assert list(tables(ast.parse('x = ("NVIDIA L4",)\ny = {"idle": 1}\n'))) == []


def test_gpu_models_and_profiles_are_defined_once() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if path.resolve() in CATALOGUE or ".venv" in path.parts:
                continue
            name = str(path.relative_to(REPO))
            for line, what in tables(ast.parse(path.read_text(), name)):
                found.append(f"{name}:{line}: {what}")
    assert not found, "define GPU models and profiles only in the catalogue:\n" + "\n".join(found)


#: Shell scripts and makefiles: they get their nodes from ``gpu-efficiency-sim node-manifests``.
SHELL_GLOBS = ("hack/**/*.sh", "bench/**/*.sh", "tests/**/*.sh", "**/Makefile")


def shell_tables(text: str) -> list[str]:
    """Catalogue facts a script states itself: a model's name or its memory size as a word."""
    facts = MODEL_NAMES | {str(m.fb_total_mib) for m in MODELS}
    return sorted(f for f in facts if re.search(rf"(?<![\w.-]){re.escape(f)}(?![\w.-])", text))


def test_shell_tables_find_what_they_look_for() -> None:
    assert shell_tables('case "$1" in\n  NVIDIA-H200) echo 143771 ;;\nesac\n') == ["143771", "NVIDIA-H200"]
    assert shell_tables("DEFAULT_MODELS=NVIDIA-L4,Tesla-T4\n") == ["NVIDIA-L4", "Tesla-T4"]
    assert shell_tables("PORT=$((181559 + OFF))  # NVIDIA-L40\n") == []


def test_shell_scripts_name_no_gpu_model() -> None:
    found = [
        f"{path.relative_to(REPO)}: {fact}"
        for pattern in SHELL_GLOBS
        for path in sorted(REPO.glob(pattern))
        if ".venv" not in path.parts
        for fact in shell_tables(path.read_text())
    ]
    assert not found, "shell scripts take GPU models from gpu-efficiency-sim node-manifests:\n" + "\n".join(
        found
    )
