"""The `gpu-efficiency-sim` commands that need no cluster, and the runner's offline parts."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from gpu_efficiency import cli as product
from gpu_efficiency_sim.cli import build_parser, main
from gpu_efficiency_sim.profiles import PROFILES
from gpu_efficiency_sim.runner import RunOptions, ScenarioRun, _find_crds
from gpu_efficiency_sim.scenario import load_scenario
from tests.unit.sources.metrics.fake_http import QuietHandler, serving

SCENARIOS = Path(__file__).resolve().parents[2] / "e2e" / "scenarios"


def test_validate_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SCENARIOS / "idle-reclaim.yaml")]) == 0
    assert "idle-reclaim.yaml: OK (1 node(s), 3 workload(s)" in capsys.readouterr().out
    assert (
        main(["validate", str(SCENARIOS / "idle-reclaim.yaml"), str(SCENARIOS / "bad" / "malformed.yaml")])
        == 2
    )
    err = capsys.readouterr().err
    assert "malformed.yaml: invalid scenario" in err
    assert "unknown profile 'idel'" in err


def test_run_rejects_a_malformed_file_with_exit_code_2_before_touching_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["run", str(SCENARIOS / "bad" / "malformed.yaml"), "--kubeconfig", "/nonexistent/kubeconfig"])
    assert code == 2
    assert "workloads[0].profile (line 11)" in capsys.readouterr().err


def test_run_and_validate_on_a_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/scenario.yaml"]) == 2
    assert "/nonexistent/scenario.yaml: invalid scenario:\n  cannot read" in capsys.readouterr().err


def test_schema_is_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert "expectations" in json.loads(capsys.readouterr().out)["properties"]
    out = tmp_path / "schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "gpu-efficiency simulator scenario"


def test_profiles_models_and_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in PROFILES)
    assert main(["models"]) == 0
    assert "NVIDIA-H100-80GB-HBM3" in capsys.readouterr().out
    assert main(["sample", "fake-load", "--seconds", "3", "--metrics", "DCGM_FI_DEV_GPU_UTIL"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "t,DEV_GPU_UTIL"
    assert len(lines) == 5
    assert all(int(line.split(",")[1]) >= 99 for line in lines[1:])


def test_promql_templates_expand_to_this_runs_names() -> None:
    run = ScenarioRun(
        load_scenario(SCENARIOS / "simulator-smoke.yaml"), RunOptions(namespace_prefix="t1-", run_id="abc123")
    )
    query = 'x{namespace="${ns:sim-smoke}", simulator="${target}", r="${run}", s="${scenario}", k="${nope}"}'
    assert run.expand(query) == (
        'x{namespace="t1-sim-smoke", simulator="sim-simulator-smoke-abc123", r="abc123", '
        's="simulator-smoke", k="${nope}"}'
    )


def test_the_crd_is_found_in_the_repository() -> None:
    docs = _find_crds(RunOptions(), SCENARIOS / "idle-reclaim.yaml")
    assert [d["metadata"]["name"] for d in docs] == ["gpuefficiencypolicies.gpuefficiency.io"]


def test_the_harness_cli_has_the_demo_and_the_product_cli_has_no_harness_command() -> None:
    assert build_parser().parse_args(["demo", "--keep"]).keep is True
    for command in ("sim", "demo"):
        with pytest.raises(SystemExit):
            product.build_parser().parse_args([command])


class _Prometheus(QuietHandler):
    """Answers ``up`` with a vector, ``time()`` with a scalar, anything else with a PromQL error."""

    def do_POST(self) -> None:  # noqa: N802 - http.server dispatches on this name
        query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        if query.startswith("up"):
            data = {"resultType": "vector", "result": [{"metric": {"instance": "a"}, "value": [1, "1"]}]}
            self.reply_json(json.dumps({"status": "success", "data": data}).encode())
        elif query == "time()":
            data = {"resultType": "scalar", "result": [1, "1"]}
            self.reply_json(json.dumps({"status": "success", "data": data}).encode())
        else:
            self.reply_json(json.dumps({"status": "error", "error": "parse error"}).encode(), status=400)


def test_metric_expectations_query_through_the_operators_client() -> None:
    """Series come back as (labels, value); an error or a non-vector answer is the reason shown."""
    with serving(_Prometheus) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = ScenarioRun(load_scenario(SCENARIOS / "simulator-smoke.yaml"), RunOptions(prometheus_url=url))
        assert run._query('up{instance="a"}') == [({"instance": "a"}, 1.0)]
        assert run._query("nonsense(") == "Prometheus query failed: parse error"
        assert run._query("time()") == "Prometheus returned 'scalar', expected a vector"


def test_serve_periods_default_and_reject_what_would_spin_a_loop(capsys: pytest.CaptureFixture[str]) -> None:
    """``--prerender`` and ``--node-poll`` pace background loops (the scale bench sets both): a
    period of zero, a negative one or NaN would spin the loop, so the parser refuses it."""
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.prerender, args.node_poll) == (None, 5.0)
    args = parser.parse_args(["serve", "--prerender", "15", "--node-poll", "30"])
    assert (args.prerender, args.node_poll) == (15.0, 30.0)
    for option in ("--prerender", "--node-poll"):
        for bad in ("0", "-5", "nan", "soon"):
            with pytest.raises(SystemExit) as exit_info:
                parser.parse_args(["serve", option, bad])
            assert exit_info.value.code == 2
            assert "seconds" in capsys.readouterr().err
