"""The README stays a first-run page that fits on a screen, and every relative link in it and in
docs/ leads to a file and heading that exist (the reference text lives in docs/, so a moved or
renamed section must not leave a dead link behind)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.user_docs import DOCS, README, ROOT

#: The admin's path (install, the exporter check, Observe, first result, Enforce) and what comes
#: before it: at most this many lines above the README's table of contents.
MAX_FRONT_LINES = 80
#: The "First run" section alone.
MAX_FIRST_RUN_LINES = 65
TOC_HEADING = "## Documentation"
FIRST_RUN_HEADING = "## First run"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted((ROOT / "charts").glob("*/README.md"))]


def without_code(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `#` there is a shell comment, a `[x](y)` no link)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, repeated headings numbered as GitHub numbers them."""
    found: set[str] = set()
    for line in without_code(page.read_text()):
        m = HEADING.match(line)
        if m:
            base = anchor = slug(m.group(1))
            n = 0
            while anchor in found:
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def dead_links(page: Path) -> list[str]:
    dead = []
    for line in without_code(page.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                dead.append(f"{target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                dead.append(f"{target}: no heading #{fragment} in {dest.name}")
    return dead


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading(page: Path) -> None:
    assert dead_links(page) == []


def test_the_readme_first_run_fits_on_one_screen() -> None:
    lines = README.read_text().splitlines()
    assert TOC_HEADING in lines, "the README's table of contents into docs/ is gone"
    assert FIRST_RUN_HEADING in lines
    toc = lines.index(TOC_HEADING)
    first_run = lines[lines.index(FIRST_RUN_HEADING) : toc]
    assert toc <= MAX_FRONT_LINES, f"{toc} lines before the table of contents"
    assert len(first_run) <= MAX_FIRST_RUN_LINES, f"the first run is {len(first_run)} lines"
    steps = " ".join(first_run)
    for step in ("helm install", "count by (job)", "mode", "kubectl get gep", "gpu-efficiency report"):
        assert step in steps, step
    assert "rbac.mode=enforce" in steps
    assert '"Enforce"' in steps


def test_the_readme_links_every_docs_page() -> None:
    readme = README.read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert missing == []


def test_the_link_check_sees_a_dead_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## Two words\n\n[ok](#two-words) [bad](b.md) [gone](#nowhere)\n")
    assert dead_links(tmp_path / "a.md") == ["b.md: no such file", "#nowhere: no heading #nowhere in a.md"]
