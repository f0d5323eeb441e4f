"""Every benchmark script imports: they run by hand, outside the test suite, so a helper renamed or
removed elsewhere (straggler_bench once imported a table engine_bench had dropped) would otherwise
break a figure the docs quote without anything noticing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p for p in BENCH.rglob("*.py") if p.name != "__init__.py")


def load_script(script: Path, monkeypatch: pytest.MonkeyPatch, *paths: Path) -> ModuleType:
    """A benchmark script imported as a module, its directory (and ``paths``) on ``sys.path`` for
    this test only: scripts import their siblings by plain name."""
    for path in (script.parent, *paths):
        monkeypatch.syspath_prepend(str(path))
    name = f"_bench_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCH)))
def test_bench_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_script(script, monkeypatch)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
