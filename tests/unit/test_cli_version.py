"""`gpu-efficiency --version` prints the installed version, the one pyproject.toml declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpu_efficiency.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_flag_prints_the_project_version(capsys: pytest.CaptureFixture[str]) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpu-efficiency {declared}"
