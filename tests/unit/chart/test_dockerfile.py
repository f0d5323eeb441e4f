"""Static checks of the Dockerfile and .dockerignore (no container engine here to build it).

They check the rules the image promises: multi-stage, base pinned by tag (never latest), wheel
built in its own stage, a numeric non-root USER in the final stage, no compilers or source tree
in it, and the `gpu-efficiency` console script as ENTRYPOINT.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with comments dropped and backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return out


def _stages() -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in _instructions((ROOT / "Dockerfile").read_text()):
        if keyword == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


def _resolve(base: str, global_args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m[1], m[0]), base)


def test_multi_stage_with_named_stages() -> None:
    _, stages = _stages()
    assert len(stages) >= 2
    assert all(s.name for s in stages), "name every stage so COPY --from is readable"


def test_bases_are_pinned_python_slim_never_latest() -> None:
    global_args, stages = _stages()
    names = {s.name for s in stages}
    for stage in stages:
        base = _resolve(stage.base, global_args)
        if base in names:
            continue
        image, _, tag = base.partition("@")[0].rpartition(":")
        assert image, f"{base}: no tag: pin the base image"
        assert tag != "latest", f"{base}: latest is not a pin"
        assert image.endswith("python"), base
        assert tag.startswith("3.11-slim"), base


def test_wheel_is_built_without_dependencies_and_installed_from_the_wheel() -> None:
    _, stages = _stages()
    assert any("pip wheel --no-deps" in run for s in stages for run in s.args("RUN"))
    installs = [run for s in stages for run in s.args("RUN") if " install " in f" {run} "]
    assert any(".whl" in run for run in installs), installs


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    _, stages = _stages()
    users = stages[-1].args("USER")
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), f"USER {users[-1]}: use a numeric uid (Pod Security runAsNonRoot needs one)"
    assert int(uid) != 0, "USER 0 is root"
    if gid:
        assert gid.isdigit(), users[-1]
        assert int(gid) != 0, users[-1]


def test_final_stage_has_no_build_tools_or_source_tree() -> None:
    _, stages = _stages()
    final = stages[-1]
    runs = " ".join(final.args("RUN"))
    for tool in ("gcc", "build-essential", "make ", "apt-get install", "pip install", "pip wheel"):
        assert tool not in runs, f"final stage runs {tool!r}"
    for copy in final.args("COPY"):
        assert copy.startswith("--from="), f"final stage copies from the build context: COPY {copy}"


def test_entrypoint_is_the_console_script_and_defaults_to_the_operator() -> None:
    _, stages = _stages()
    final = stages[-1]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    raw = final.args("ENTRYPOINT")[-1]
    assert raw.startswith("["), f"ENTRYPOINT {raw}: use the exec form so signals reach the process"
    entrypoint = json.loads(raw)
    assert entrypoint == ["gpu-efficiency"]
    assert entrypoint[0] in scripts
    assert json.loads(final.args("CMD")[-1]) == ["run"]


def test_runtime_never_writes_bytecode() -> None:
    _, stages = _stages()
    env = " ".join(stages[-1].args("ENV"))
    assert re.search(r"\bPYTHONDONTWRITEBYTECODE=1\b", env), (
        "a read-only root filesystem cannot take .pyc files"
    )


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Deny everything, then allow back only what the build copies.
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    _, stages = _stages()
    copied = {
        src.rstrip("/")
        for s in stages
        for copy in s.args("COPY")
        if not copy.startswith("--from=")
        for src in copy.split()[:-1]
    }
    assert copied <= allowed, f"COPY needs {copied - allowed} but .dockerignore leaves it out"
    assert allowed <= {"pyproject.toml", "requirements.lock", "README.md", "operator", "LICENSE"}, allowed
