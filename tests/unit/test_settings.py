"""The operator's settings are declared once (config.OperatorConfig): every one has its flag on the
commands that take it, its GPUEFF_* variable and its row in docs/cli.md, the flag beats the variable beats the
default, bad text is a clear error, and the configuration reaches Kopf's handlers through the memo,
never through a module global (issue 20 item 5)."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any

import kopf
import pytest

from gpu_efficiency import malloc_tuning
from gpu_efficiency.cli import build_parser, main
from gpu_efficiency.config import DEFAULT_MATCHERS, SETTINGS, OperatorConfig, config_from_args, update_readme
from gpu_efficiency.runtime import kopf_wiring
from gpu_efficiency.settings import SettingError
from tests.unit.user_docs import SETTINGS_REFERENCE

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "gpu_efficiency"


def _flags(command: str) -> set[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {flag for action in sub.choices[command]._actions for flag in action.option_strings}


def test_every_setting_has_its_flag_variable_and_readme_row() -> None:
    readme = SETTINGS_REFERENCE.read_text()
    assert len({s.flag for s in SETTINGS}) == len({s.env for s in SETTINGS}) == len(SETTINGS)
    for s in SETTINGS:
        assert s.env == "GPUEFF_" + s.name.upper(), s.name
        assert s.help, s.name
        for command in ("run", "report", "explain"):
            assert (s.flag in _flags(command)) == (command in s.commands), (s.name, command)
        assert re.search(rf"^\| `{re.escape(s.flag)}`.*\| `{s.env}` \|", readme, re.MULTILINE), s.name


def test_readme_settings_table_is_current() -> None:
    readme = SETTINGS_REFERENCE.read_text()
    assert update_readme(readme) == readme, "docs/cli.md's settings table drifted: run `make docs`"


def test_names_and_defaults_are_those_the_chart_and_users_rely_on() -> None:
    config = OperatorConfig(identity="x")
    assert {s.flag: getattr(config, s.name) for s in SETTINGS} == {
        "--prometheus-url": "http://127.0.0.1:9090",
        "--prometheus-token-file": None,
        "--prometheus-basic-auth-file": None,
        "--prometheus-ca-file": None,
        "--prometheus-insecure-skip-verify": False,
        "--prometheus-matchers": DEFAULT_MATCHERS,
        "--prometheus-max-series": 2_000_000,
        "--prometheus-refresh-budget": 0,
        "--prometheus-credentials-for": (),
        "--prometheus-headers": (),
        "--operator-namespace": "gpu-efficiency-system",
        "--protected-namespaces": (),
        "--dry-run": False,
        "--leader-election": True,
        "--lease-name": "gpu-efficiency-operator",
        "--lease-seconds": 15.0,
        "--identity": "x",
        "--metrics-port": 8080,
        "--health-port": 8081,
        "--api-timeout": 30.0,
        "--status-refresh-seconds": 300.0,
        "--agent-urls": (),
        "--agent-token-file": None,
        "--watch-cache": True,
        "--fault-wake-min-gap": 2.0,
        "--log-level": "INFO",
        "--log-format": "text",
        "--slack-signing-secret-file": "",
        "--slack-response-urls": "https://hooks.slack.com/,https://hooks.slack-gov.com/",
        "--notify-secret-dir": "/etc/gpu-efficiency/notify",
        "--selfservice-port": 0,
        "--selfservice-url": "",
        "--selfservice-key-file": "/etc/gpu-efficiency/selfservice/key",
        "--currency": "USD",
    }
    insecure = next(s for s in SETTINGS if s.name == "prometheus_insecure")
    assert insecure.env == "GPUEFF_PROMETHEUS_INSECURE"  # what the chart sets


def test_the_chart_passes_only_declared_flags_and_variables() -> None:
    text = (ROOT / "charts" / "gpu-efficiency-operator" / "templates" / "deployment.yaml").read_text()
    run_flags = {f for s in SETTINGS if "run" in s.commands for f in (s.flag, s.negation) if f}
    assert set(re.findall(r"^\s+- (--[a-z-]+)", text, re.MULTILINE)) <= run_flags
    assert set(re.findall(r"- name: (GPUEFF_\w+)", text)) <= {s.env for s in SETTINGS}


def _run_config(argv: list[str]) -> OperatorConfig:
    return config_from_args(build_parser().parse_args(["run", *argv]))


def test_flag_beats_variable_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    assert _run_config([]).lease_seconds == 15.0
    monkeypatch.setenv("GPUEFF_LEASE_SECONDS", "20")
    monkeypatch.setenv("GPUEFF_LEADER_ELECTION", "0")
    monkeypatch.setenv("GPUEFF_IDENTITY", "")  # empty: the computed default
    config = _run_config([])
    assert (config.lease_seconds, config.leader_election, config.identity) == (
        20.0,
        False,
        OperatorConfig().identity,
    )
    config = _run_config(["--lease-seconds=9", "--leader-election", "--identity=me"])
    assert (config.lease_seconds, config.leader_election, config.identity) == (9.0, True, "me")
    # a setting the command does not take keeps its default, whatever the environment says
    report = config_from_args(build_parser().parse_args(["report"]))
    assert (report.lease_seconds, report.leader_election) == (15.0, True)


@pytest.mark.parametrize(
    ("env", "text", "expected"),
    [
        ("GPUEFF_LEASE_SECONDS", "soon", "is not a number"),
        ("GPUEFF_METRICS_PORT", "8080.5", "is not an integer"),
        ("GPUEFF_DRY_RUN", "ture", "is not a boolean"),
        ("GPUEFF_LOG_FORMAT", "xml", "is not one of text, json"),
    ],
)
def test_bad_text_is_a_clear_error(
    env: str, text: str, expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(env, text)
    with pytest.raises(SettingError, match=rf"\${env}: '{text}' {expected}"):
        _run_config([])
    monkeypatch.setattr(kopf, "run", _must_not_run)
    assert main(["run"]) == 2
    assert f"${env}: '{text}' {expected}" in capsys.readouterr().err


def _must_not_run(**_: Any) -> None:
    raise AssertionError("the operator started with a bad setting")


def test_run_hands_the_configuration_to_kopf_in_its_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    started: dict[str, Any] = {}
    monkeypatch.setattr(malloc_tuning, "tune", lambda: None)
    monkeypatch.setattr(kopf, "configure", lambda **_: None)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: started.update(kwargs))
    assert main(["run", "--lease-name=mine", "--dry-run"]) == 0
    config = started["memo"].config
    assert (config.lease_name, config.dry_run) == ("mine", True)


class _StartedError(Exception):
    pass


def test_startup_builds_the_runner_from_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[OperatorConfig] = []

    def build_runner(config: OperatorConfig, **_: Any) -> None:
        built.append(config)
        raise _StartedError

    monkeypatch.setattr(kopf_wiring, "build_runner", build_runner)
    config = OperatorConfig(lease_name="from-memo")
    with pytest.raises(_StartedError):
        kopf_wiring.startup(settings=kopf.OperatorSettings(), memo=kopf_wiring.initial_memo(config))
    assert built == [config]
    with pytest.raises(RuntimeError, match="memo holds no configuration"):
        kopf_wiring.startup(settings=kopf.OperatorSettings(), memo=kopf.Memo())


def _module_level_config(path: Path) -> list[str]:
    """Module-level names annotated as, or assigned, an OperatorConfig."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and "OperatorConfig" in ast.unparse(node.annotation):
            found.append(ast.unparse(node.target))
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("OperatorConfig"):
            found.append(ast.unparse(node))
    return found


def test_no_module_holds_the_configuration(tmp_path: Path) -> None:
    holders = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := _module_level_config(path))
    }
    assert holders == {}
    probe = tmp_path / "probe.py"  # the check sees the global this replaced, and a default instance
    probe.write_text("CONFIG: OperatorConfig | None = None\nDEFAULT = config.OperatorConfig()\n")
    assert len(_module_level_config(probe)) == 2
