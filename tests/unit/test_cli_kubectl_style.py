"""The CLI behaves as kubectl users expect: -n is the namespace you look at, --kubeconfig/--context
pick the cluster, -o table|json|yaml on every read command, one error line with a documented exit
code (never a traceback), and the same CLI as the kubectl plugin ``kubectl gpu-efficiency``."""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from gpu_efficiency import cli, cli_common
from gpu_efficiency.cli_common import (
    EXIT_CLUSTER,
    EXIT_CODES,
    EXIT_USAGE,
    CliError,
    current_namespace,
    pod_ref,
)
from gpu_efficiency.config import config_from_args
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.report import build_report, only_namespace
from tests.unit.engine import builders as b
from tests.unit.user_docs import SETTINGS_REFERENCE

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_COMMANDS = ("report", "explain", "restore", "keep", "cleanup")
READ_COMMANDS = ("report", "explain", "cleanup")
#: One argv per cluster command that passes argument checks and so must reach the credentials.
VALID = {
    "report": ["report"],
    "explain": ["explain", "team-a/nb-0"],
    "restore": ["restore", "deployment/web", "-n", "team-a"],
    "keep": ["keep", "nb-0", "4h", "-n", "team-a"],
    "cleanup": ["cleanup", "--dry-run"],
}
#: Nothing listens on the discard port: a request fails at once with "connection refused".
KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: main
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:9"}
users:
- name: u
  user: {token: t}
contexts:
- name: main
  context: {cluster: c, user: u, namespace: team-main}
- name: other
  context: {cluster: c, user: u, namespace: team-other}
- name: bare
  context: {cluster: c, user: u}
"""


@pytest.fixture(autouse=True)
def _not_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GPUEFF_NAMESPACE", raising=False)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)


def _subparser(name: str) -> argparse.ArgumentParser:
    (sub,) = (a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _flags(name: str) -> set[str]:
    return {flag for action in _subparser(name)._actions for flag in action.option_strings}


@pytest.mark.parametrize("command", CLUSTER_COMMANDS)
def test_every_cluster_command_takes_kubeconfig_and_context_and_documents_its_exit_codes(
    command: str,
) -> None:
    assert {"--kubeconfig", "--context"} <= _flags(command)
    help_text = _subparser(command).format_help()
    assert "exit codes:" in help_text
    assert "examples:" in help_text
    for code, _ in EXIT_CODES:
        assert re.search(rf"^  {code}\s", help_text, re.MULTILINE), (command, code)


@pytest.mark.parametrize("command", READ_COMMANDS)
@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_every_read_command_prints_table_json_or_yaml(command: str, output: str) -> None:
    args = cli.build_parser().parse_args([*VALID[command], "-o", output])
    assert args.output == output


def test_namespace_is_the_namespace_you_look_at_not_the_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser().parse_args(["report", "-n", "team-a"])
    config = config_from_args(args)
    assert args.target_namespace == "team-a"
    assert "team-a" not in config.all_protected_namespaces  # it used to hide exactly the namespace named
    assert config.namespace == "gpu-efficiency-system"
    assert cli.build_parser().parse_args(["report", "--namespace", "team-a"]).target_namespace == "team-a"
    # the operator's own namespace has a flag of its own and keeps its variable
    moved = config_from_args(cli.build_parser().parse_args(["report", "--operator-namespace", "ops"]))
    assert moved.namespace == "ops"
    assert "ops" in moved.all_protected_namespaces
    monkeypatch.setenv("GPUEFF_NAMESPACE", "from-env")
    assert config_from_args(cli.build_parser().parse_args(["explain", "x/y"])).namespace == "from-env"
    # `run` keeps the old spelling, so deployments written for it keep working
    assert config_from_args(cli.build_parser().parse_args(["run", "--namespace", "old"])).namespace == "old"
    assert (
        config_from_args(cli.build_parser().parse_args(["run", "--operator-namespace", "new"])).namespace
        == "new"
    )


def test_the_default_namespace_is_the_contexts_as_kubectl_uses(kubeconfig: str, tmp_path: Path) -> None:
    def ns(*argv: str) -> str:
        return current_namespace(cli.build_parser().parse_args(["restore", "deployment/x", *argv]))

    assert ns("--kubeconfig", kubeconfig) == "team-main"
    assert ns("--kubeconfig", kubeconfig, "--context", "other") == "team-other"
    assert ns("--kubeconfig", kubeconfig, "--context", "bare") == "default"
    assert ns("--kubeconfig", kubeconfig, "-n", "given") == "given"
    assert ns("--kubeconfig", str(tmp_path / "missing")) == "default"


def test_a_pod_is_pod_in_the_namespace_or_namespace_slash_pod(kubeconfig: str) -> None:
    def ref(*argv: str) -> tuple[str, str]:
        args = cli.build_parser().parse_args(["explain", *argv, "--kubeconfig", kubeconfig])
        return pod_ref(args.pod, args)

    assert ref("nb-0", "-n", "team-a") == ("team-a", "nb-0")
    assert ref("nb-0") == ("team-main", "nb-0")
    assert ref("team-a/nb-0") == ("team-a", "nb-0")
    assert ref("team-a/nb-0", "-n", "team-a") == ("team-a", "nb-0")
    for bad in (["a/b/c"], ["team-a/"], ["/nb-0"], ["team-a/nb-0", "-n", "team-b"]):
        with pytest.raises(CliError) as err:
            ref(*bad)
        assert err.value.code == EXIT_USAGE


@pytest.mark.parametrize("command", CLUSTER_COMMANDS)
def test_no_credentials_is_one_line_and_exit_3_for_every_command(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nonexistent"))
    assert cli.main(VALID[command]) == EXIT_CLUSTER
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"gpu-efficiency {command}: error: cannot load Kubernetes credentials: Invalid kube-config file. "
        "No configuration found."
    ], err


@pytest.mark.parametrize("command", ["restore", "keep", "cleanup"])
def test_an_unreachable_api_server_is_exit_3_not_a_traceback(
    command: str, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*VALID[command], "--kubeconfig", kubeconfig]) == EXIT_CLUSTER
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gpu-efficiency {command}: error: cannot reach the Kubernetes API: "), line


def test_an_unknown_context_is_exit_3(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keep", "nb-0", "4h", "--kubeconfig", kubeconfig, "--context", "nope"]) == EXIT_CLUSTER
    assert "cannot load Kubernetes credentials" in capsys.readouterr().err


@pytest.mark.parametrize("duration", ["-1h", "-30m"])
def test_a_negative_keep_duration_is_named_as_such(duration: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keep", "team-a/nb-0", duration]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"gpu-efficiency keep: error: {duration!r} is negative: write how long to keep the GPU, like 4h\n"
    )


def test_bad_pod_references_fail_before_reading_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nonexistent"))
    assert cli.main(["explain", "a/b/c"]) == EXIT_USAGE
    assert cli.main(["keep", "a/b/c", "4h"]) == EXIT_USAGE
    assert cli.main(["restore", "web", "-n", "x"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "credentials" not in err
    assert err.count(": error: ") == 3


def test_a_policy_file_that_is_not_yaml_is_a_usage_error(
    tmp_path: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_efficiency import report

    bad = tmp_path / "p.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(report.ReportError) as err:
        report.load_policy(cli.build_parser().parse_args(["report", "--policy-file", str(bad)]), None)
    assert err.value.code == EXIT_USAGE
    assert "is not a policy document" in str(err.value)


def test_json_and_yaml_are_the_same_document() -> None:
    doc = {"pods": [{"pod": "a/b", "verdict": "Idle"}], "n": 1.5}
    assert json.loads(cli_common.render(doc, "json", str)) == doc
    assert yaml.safe_load(cli_common.render(doc, "yaml", str)) == doc
    assert cli_common.render(doc, "table", lambda d: "TABLE") == "TABLE"


def test_report_of_one_namespace_keeps_only_its_rows_pods_and_actions() -> None:
    snap = b.snapshot(
        [
            b.gpu("GPU-0", b.idle(), ("team-a", "nb-a")),
            b.gpu("GPU-1", b.idle(), ("team-b", "nb-b")),
        ],
        [b.pod("nb-a", namespace="team-a"), b.pod("nb-b", namespace="team-b")],
        b.policy(),
    )
    full = build_report(snap, plan_cycle(snap))
    assert {r["namespace"] for r in full["namespaces"]} == {"team-a", "team-b"}
    mine = only_namespace(full, "team-a")
    assert mine["namespace"] == "team-a"
    assert [r["namespace"] for r in mine["namespaces"]] == ["team-a"]
    assert [p["pod"] for p in mine["pods"]] == ["team-a/nb-a"]
    assert all(a["pod"].startswith("team-a/") for a in mine["actions"])
    assert not any(n.startswith("team-b/") for n in mine["notes"])


def test_the_kubectl_plugin_is_the_same_cli_under_kubectls_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["kubectl-gpu_efficiency"].partition(":")
    plugin = getattr(import_module(module), function)
    assert plugin is cli.kubectl_plugin
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nonexistent"))
    monkeypatch.setattr("sys.argv", ["kubectl-gpu_efficiency", "keep", "nb-0", "4h", "-n", "team-a"])
    assert plugin() == EXIT_CLUSTER
    assert capsys.readouterr().err.startswith("kubectl gpu-efficiency keep: error: ")


def test_the_installed_package_puts_the_plugin_on_the_path() -> None:
    """pip (the image installs the wheel the same way) writes kubectl-gpu_efficiency beside gpu-efficiency."""
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["kubectl-gpu_efficiency"] == "gpu_efficiency.cli:kubectl_plugin"
    assert scripts["gpu-efficiency"] == "gpu_efficiency.cli:main"


def test_the_readme_lists_every_exit_code() -> None:
    readme = SETTINGS_REFERENCE.read_text()  # docs/cli.md
    for code, meaning in EXIT_CODES:
        assert f"| {code} | {meaning} |" in readme, code


def test_only_the_keep_command_reads_a_leading_dash_digit_as_a_negative_duration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):  # argparse's own error: -1 is no flag of report
        cli.main(["report", "--policy", "keep", "-1"])
    assert "is negative" not in capsys.readouterr().err
