"""requirements.lock, which the Dockerfile installs with --require-hashes, pins every runtime dependency
of pyproject.toml (and everything they pull in) to one version that satisfies pyproject's range, with
sha256 hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")


def parse_lock(text: str) -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, sha256 hashes). Raises ValueError on a requirement that is not pinned."""
    locked: dict[str, tuple[Version, list[str]]] = {}
    entries = re.split(r"\n(?=\S)", re.sub(r"^#.*$", "", text, flags=re.M).strip())
    for entry in filter(None, (e.strip() for e in entries)):
        match = _PIN.match(entry)
        if match is None:
            raise ValueError(f"not pinned with ==: {entry.splitlines()[0]!r}")
        locked[canonicalize_name(match[1])] = (Version(match[2]), _HASH.findall(entry))
    return locked


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_every_runtime_dependency_is_pinned_with_hashes_in_its_range() -> None:
    locked = parse_lock((ROOT / "requirements.lock").read_text())
    problems = []
    for req in _runtime_requirements():
        entry = locked.get(canonicalize_name(req.name))
        if entry is None:
            problems.append(f"{req.name}: not in requirements.lock")
            continue
        version, hashes = entry
        if not hashes:
            problems.append(f"{req.name}=={version}: no --hash")
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version}: outside pyproject's {req.specifier}")
    assert problems == []


def test_every_locked_package_has_a_hash() -> None:
    locked = parse_lock((ROOT / "requirements.lock").read_text())
    assert len(locked) >= len(_runtime_requirements())
    assert [name for name, (_, hashes) in locked.items() if not hashes] == []


def test_the_parser_refuses_loose_entries_and_sees_missing_hashes() -> None:
    assert parse_lock("a==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via x\nb==2\n") == {
        "a": (Version("1.0"), ["0" * 64]),
        "b": (Version("2"), []),
    }
    for loose in ("c>=1\n", "d\n", "-e .\n"):
        try:
            parse_lock(loose)
        except ValueError:
            continue
        raise AssertionError(f"{loose!r} was accepted")


def test_the_image_installs_the_lock_with_required_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile
    assert "-r /tmp/requirements.lock" in dockerfile
    assert "COPY requirements.lock" in dockerfile
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text()
    # Our own wheel must not pull unlocked dependencies.
    wheel_installs = [line for line in dockerfile.splitlines() if "/wheels/*.whl" in line]
    assert wheel_installs
    assert all("--no-deps" in line for line in wheel_installs)
