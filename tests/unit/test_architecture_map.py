"""The map stays true: docs/architecture.md names every module of the operator's package, and every
safety rule the repository cites by number is one of the numbered list in docs/safety.md.

A module the map does not name is one a newcomer cannot find from the map; a path the map names
that no longer exists sends them to nothing (a move must update the map in the same commit). A rule
number that is not in the list, cited with another rule's title, or cited under another spelling
("guarantee N", a file outside the repository) is a promise nobody can look up.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tests.unit.user_docs import DOCS, README, ROOT

PACKAGE = ROOT / "operator" / "gpu_efficiency"
ARCHITECTURE = DOCS / "architecture.md"
SAFETY = DOCS / "safety.md"
#: The section of the architecture page that lists every module once, by its path in the package.
MODULE_MAP_HEADING = "## Module map"
#: A rule of the list: "N. **Title.** ..." at the start of a line.
RULE_ITEM = re.compile(r"^(\d+)\. \*\*(.+?)\*\*", re.MULTILINE)
#: The one way to cite a rule: "safety rule N" (or "safety rules N and M", "safety rules N, M").
CITATION = re.compile(r"(?i)\bsafety rules? (\d+(?:(?:, | and | or )\d+)*)(?:: ([^.;)\n]+))?")
#: Spellings that cite a rule some other way.
OTHER_SPELLINGS = re.compile(r"(?i)\b(?:safety )?guarantees? \d+|\bDESIGN\.md\b|\.\./shared/|/work/shared")
#: Vendored upstream files (CRDs of other projects): not ours to cite anything.
VENDORED = ("tests/e2e/crds/",)
#: The files a citation can be in: code, docs, the chart, scripts, configuration.
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".txt", ".sh", ".toml", ".cfg", ".json", ""}
#: A path in the package as the map writes it: `engine/planner.py`, `engine/reclaim/`.
MODULE_PATH = re.compile(r"`([a-z_][a-z0-9_/]*(?:\.py|/))`")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    files = []
    for name in listed:
        if not name or name.startswith(VENDORED) or name == Path(__file__).relative_to(ROOT).as_posix():
            continue
        path = ROOT / name
        if path.suffix in TEXT_SUFFIXES and path.is_file():
            files.append(path)
    return files


def has_code(init: Path) -> bool:
    """Whether a package's ``__init__.py`` holds more than its docstring (then it is a module of its own)."""
    body = ast.parse(init.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def package_paths() -> set[str]:
    """What the map must name: every module by its path in the package, every package as ``dir/``,
    and a package's ``__init__.py`` where it holds code (a layer's face, a re-export)."""
    wanted: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            if path.parent != PACKAGE:
                wanted.add(path.parent.relative_to(PACKAGE).as_posix() + "/")
            if not has_code(path):
                continue
        wanted.add(rel)
    return wanted


def module_map() -> str:
    text = ARCHITECTURE.read_text()
    assert MODULE_MAP_HEADING in text, f"{ARCHITECTURE.name} has no '{MODULE_MAP_HEADING}' section"
    section = text.split(MODULE_MAP_HEADING, 1)[1]
    return re.split(r"^## ", section, maxsplit=1, flags=re.MULTILINE)[0]


def named_in_map() -> set[str]:
    return set(MODULE_PATH.findall(module_map()))


def rules() -> dict[int, str]:
    found = {int(n): title.rstrip(".").lower() for n, title in RULE_ITEM.findall(SAFETY.read_text())}
    assert sorted(found) == list(range(1, len(found) + 1)), f"{SAFETY.name} numbers its rules {sorted(found)}"
    return found


def test_every_module_is_named_in_the_map() -> None:
    missing = sorted(package_paths() - named_in_map())
    assert not missing, f"modules not named in {ARCHITECTURE.name}'s {MODULE_MAP_HEADING}: {missing}"


def test_every_path_the_map_names_exists() -> None:
    stale = sorted(p for p in named_in_map() if not (PACKAGE / p).exists())
    assert not stale, f"{ARCHITECTURE.name}'s {MODULE_MAP_HEADING} names paths that do not exist: {stale}"


def test_the_readme_links_the_one_list_of_safety_rules() -> None:
    assert "(docs/safety.md)" in README.read_text()
    assert len(rules()) >= 1


def test_every_cited_safety_rule_exists_under_its_own_title() -> None:
    known = rules()
    titles = {" ".join(t.split()[:3]): n for n, t in known.items()}
    wrong: list[str] = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for m in CITATION.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            numbers = [int(n) for n in re.findall(r"\d+", m.group(1))]
            wrong += [f"{where}: rule {n} is not in {SAFETY.name}" for n in numbers if n not in known]
            said = " ".join((m.group(2) or "").lower().split()[:3])
            if len(numbers) == 1 and said in titles and titles[said] != numbers[0]:
                wrong.append(f"{where}: rule {numbers[0]} cited with rule {titles[said]}'s title '{said}'")
    assert not wrong, "\n".join(wrong)


def test_rules_are_cited_one_way_and_only_from_the_repository() -> None:
    odd = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        odd += [
            f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in OTHER_SPELLINGS.finditer(text)
        ]
    assert not odd, "cite 'safety rule N' (docs/safety.md), nothing outside the repository:\n" + "\n".join(
        odd
    )


def test_the_architecture_page_says_where_every_rule_lives() -> None:
    cited = {
        int(n) for m in CITATION.finditer(ARCHITECTURE.read_text()) for n in re.findall(r"\d+", m.group(1))
    }
    missing = sorted(set(rules()) - cited)
    assert not missing, f"{ARCHITECTURE.name} does not say where safety rules {missing} live"
