"""The e2e hook: fake scenarios (profiles, faults over time), --fake-pods, and ``gpu-efficiency-sim agent``
as a process; the product's ``gpu-efficiency agent`` has no fake backend."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_efficiency.agent.cli import add_agent_command, build_agent, nvml_backend
from gpu_efficiency.agent.collect import Collector
from gpu_efficiency.agent.nvml.types import EccCounter, EventKind
from gpu_efficiency.agent.pods import PodAttribution
from gpu_efficiency_sim.fake_nvml.backend import fake_gpu, fake_uuid
from gpu_efficiency_sim.fake_nvml.command import add_fake_agent_command, fake_backend
from gpu_efficiency_sim.fake_nvml.scenario import build_fake, profile_values
from gpu_efficiency_sim.gpu_models import MODELS, find_model
from gpu_efficiency_sim.profiles import PROFILES

SCENARIO = """
gpus:
  - profile: compute-bound
    pods: [ml/train-0/worker]
  - profile: idle
    uuid: GPU-fixed
    model: NVIDIA A100-SXM4-80GB
    gpm: false
    unsupported: [memory_temperature]
    values: {temp_c: 40}
  - mig: [1g.10gb, 2g.20gb]
timeline:
  - {at: 10s, gpu: 0, profile: idle}
  - {at: 20s, gpu: GPU-fixed, event: xid, xid: 79, values: {temp_c: 95, clock_event_reasons: 0x40}}
  - {at: 30s, gpu: all, supported: [memory_temperature], unsupported: [power]}
"""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_scenario_file_drives_values_faults_and_attribution(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    clock = _Clock()
    backend, pods = build_fake("node-a", scenario=path, clock=clock)
    backend.init()
    first, fixed, mig = backend.gpus
    assert first.uuid == fake_uuid("node-a", 0)
    assert pods == {first.uuid: (PodAttribution("ml", "train-0", "worker"),)}
    assert backend.utilization(first.uuid).gpu == profile_values("compute-bound", seed=0)["gpu_util"]
    assert fixed.name == "NVIDIA A100-SXM4-80GB"
    assert backend.temperature_c("GPU-fixed") == 40
    assert fixed.gpm is None
    assert fixed.errors == {"memory_temperature": 3}
    assert [d.mig_profile for d in backend.mig_devices(mig.info())] == ["1g.10gb", "2g.20gb"]
    backend.open_events([g.uuid for g in backend.gpus])

    clock.now = 10.0
    assert backend.utilization(first.uuid).gpu == 0.0  # profile changed at 10 s
    assert backend.wait_event(0.01) is None
    clock.now = 20.0
    event = backend.wait_event(0.5)
    assert event is not None
    assert (event.uuid, event.kind, event.data) == ("GPU-fixed", EventKind.XID, 79)
    assert backend.clock_event_reasons("GPU-fixed") == 0x40
    clock.now = 30.0
    reading = Collector(backend).read(fixed.info())
    assert "memory_temp_c" in reading.values
    assert reading.failures["power_w"] == "NVML_ERROR_NOT_SUPPORTED"


def test_inbox_files_apply_once_as_steps_due_now(tmp_path: Path) -> None:
    """How a bench or test in another process injects an NVML event at a moment it knows."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    backend, _ = build_fake("n", gpus=2, inbox=inbox)
    backend.init()
    backend.open_events([g.uuid for g in backend.gpus])
    assert backend.wait_event(0.06) is None
    (inbox / "1.json").write_text('{"gpu": 1, "event": "xid", "xid": 48}')
    (inbox / "2.json").write_text('{"gpu": 0, "event": "dbe"}')
    (inbox / "3.json").write_text('["not", "a", "step"]')
    first, second = backend.wait_event(0.5), backend.wait_event(0.5)
    assert first is not None
    assert second is not None
    assert (first.uuid, first.kind, first.data) == (fake_uuid("n", 1), EventKind.XID, 48)
    assert (second.uuid, second.kind) == (fake_uuid("n", 0), EventKind.DBE)
    assert backend.ecc_uncorrected(fake_uuid("n", 0), EccCounter.VOLATILE) == 1
    assert backend.wait_event(0.1) is None  # each file applied once
    assert sorted(p.name for p in inbox.iterdir()) == ["3.rejected"]


def test_count_profile_and_fake_pods_by_index_or_uuid() -> None:
    backend, pods = build_fake("n", gpus=3, profile="fake-load", pods=f"a/p=0,b/q={fake_uuid('n', 2)}")
    backend.init()
    assert [backend.utilization(g.uuid).gpu for g in backend.gpus] == [
        profile_values("fake-load", seed=i)["gpu_util"] for i in range(3)
    ]
    assert pods == {
        fake_uuid("n", 0): (PodAttribution("a", "p"),),
        fake_uuid("n", 2): (PodAttribution("b", "q"),),
    }


def test_bad_scenarios_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        build_fake("n", gpus=1, profile="nope")
    path = tmp_path / "bad.yaml"
    path.write_text("gpus:\n  - values: {uuid: x}\n")
    with pytest.raises(ValueError, match="uuid"):
        build_fake("n", scenario=path)
    path.write_text("gpus:\n  - unsupported: [warp_drive]\n")
    with pytest.raises(ValueError, match="warp_drive"):
        build_fake("n", scenario=path)


def test_every_profile_is_a_complete_fake() -> None:
    for name in PROFILES:
        backend, _ = build_fake("n", gpus=1, profile=name)
        backend.init()
        assert backend.gpm_metrics(backend.gpus[0].uuid) is None
        gpm = backend.gpm_metrics(backend.gpus[0].uuid)
        assert gpm is not None
        assert gpm.sm_util is not None


def _parser(add: Callable[[Any], Any] = add_fake_agent_command) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    add(parser.add_subparsers(dest="command"))
    return parser


def test_cli_flags_build_the_agent() -> None:
    args = _parser().parse_args(["agent", "--fake-gpus", "2", "--interval", "500ms", "--node-name", "gpu-7"])
    agent = build_agent(args, backend_factory=fake_backend)
    assert (agent.backend.name, agent.config.interval_s, agent.config.node_name) == ("fake", 0.5, "gpu-7")
    assert agent.config.history_s == 900.0
    assert args.listen == "0.0.0.0:9400"
    assert (args.max_connections, args.request_timeout, args.auth) == (32, 10.0, "none")
    limited = _parser(add_agent_command).parse_args(
        ["agent", "--max-connections", "4", "--request-timeout", "2s", "--auth", "tokenreview"]
    )
    assert (limited.max_connections, limited.request_timeout, limited.auth) == (4, 2.0, "tokenreview")
    for bad in (
        ["--max-connections", "0"],
        ["--request-timeout", "0s"],
        ["--auth", "basic"],
        ["--interval", "0s"],
        ["--interval", "soon"],
        ["--listen", "nohost"],
        ["--critical-xids", "x"],
    ):
        with pytest.raises(SystemExit):
            _parser(add_agent_command).parse_args(["agent", *bad])


def test_the_product_agent_has_only_real_nvml() -> None:
    """``gpu-efficiency agent`` takes no fake-backend flag; its backend is nvidia-ml-py's."""
    for fake in (["--backend", "fake"], ["--fake-gpus", "2"], ["--fake-scenario", "s.yaml"]):
        with pytest.raises(SystemExit):
            _parser(add_agent_command).parse_args(["agent", *fake])
    args = _parser(add_agent_command).parse_args(["agent"])
    backend, static = nvml_backend(args)
    assert (backend.name, static) == ("nvml", {})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agent_process_serves_and_stops_on_sigterm(wait_until: Callable[..., Any]) -> None:
    port = _free_port()
    env = os.environ | {"NODE_NAME": "node-from-env"}
    cmd = [sys.executable, "-m", "gpu_efficiency_sim", "agent", "--fake-gpus", "2"]
    proc = subprocess.Popen(
        [*cmd, "--fake-profile", "compute-bound", "--fake-pods", "ml/x=1", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(timeout=2.0) as http:

            def ready() -> bool:
                try:
                    return http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(ready, timeout=20.0, step=0.1)
            text = http.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'hostname="node-from-env"' in text  # dcgm-exporter 4.8.3+'s label, the default
        assert 'pod="x"' in text
        assert "_created" not in text  # no client-library noise next to dcgm's names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert "stopping" in out


def test_fake_gpus_take_their_envelope_from_the_model_catalogue(tmp_path: Path) -> None:
    """Every catalogue model makes a fake GPU of its memory, power, clock and link; GPM from Hopper on."""
    for model in MODELS:
        g = fake_gpu(model, 0, "GPU-x")
        assert find_model(g.name) is model
        assert (g.fb_total_mib, g.power_w, g.power_limit_w, g.sm_clock_mhz) == (
            model.fb_total_mib,
            model.idle_power_w,
            model.max_power_w,
            model.sm_clock_max_mhz,
        )
        assert (g.pcie_max_gen, g.pcie_max_width) == (model.pcie_gen, model.pcie_width)
        assert (g.gpm is not None) == (model.family == "hopper")
    path = tmp_path / "s.yaml"
    path.write_text("gpus:\n  - model: NVIDIA-L4\n")
    (l4,) = build_fake("n", scenario=path)[0].gpus
    assert (l4.name, l4.fb_total_mib, l4.gpm) == ("NVIDIA L4", 23034, None)
    path.write_text("gpus:\n  - model: NVIDIA Voodoo 5\n")
    with pytest.raises(ValueError, match="unknown GPU model"):
        build_fake("n", scenario=path)


def test_fake_profiles_are_the_simulators_in_nvml_units() -> None:
    """One table of profiles: the fake plays each of the simulator's, scaled to the GPU's model, with
    the signature that tells it apart."""
    h100, l4 = find_model("NVIDIA-H100-80GB-HBM3"), find_model("NVIDIA-L4")
    idle, busy = profile_values("idle"), profile_values("compute-bound")
    assert (idle["gpu_util"], idle["gpm"].sm_util, idle["fb_used_mib"]) == (0.0, 0.0, 0)
    assert idle["clock_event_reasons"] & 0x1  # GPU_IDLE
    assert abs(idle["power_w"] - h100.idle_power_w) < 0.05 * h100.idle_power_w
    assert busy["gpm"].sm_util > 80
    assert busy["gpm"].any_tensor_util > 50
    assert profile_values("compute-bound", l4)["power_w"] <= l4.max_power_w < busy["power_w"]
    starved, fake_load = profile_values("input-starved")["gpm"], profile_values("fake-load")
    assert starved.pcie_rx_mib_s > 2 * busy["gpm"].pcie_rx_mib_s
    assert starved.sm_util < 30
    assert fake_load["gpu_util"] > 95
    assert fake_load["gpm"].sm_util < 10
    assert profile_values("thermal-throttled")["clock_event_reasons"] & 0x20  # SW thermal slowdown
    with pytest.raises(ValueError, match="unknown profile"):
        profile_values("nope")
