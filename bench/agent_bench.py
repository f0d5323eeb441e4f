"""Node agent cost: CPU time and RSS of sampling every field of 8 GPUs, against shelling out to nvidia-smi.

    python bench/agent_bench.py [--gpus 8] [--samples 2000] [--seconds 20] [--calls 200]

Measured in one run:
  1. agent, per sample  -- ``Agent.sample_once`` in a loop over N GPUs (fake NVML; real NVML too where a
                           driver answers): CPU time per round of all fields.
  2. agent, as deployed -- the agent process (``gpu-efficiency-sim agent``, 1 s interval, scraped every 15 s,
                           kubelet attribution path with its fallback, so grpc is loaded as in production):
                           CPU share of one core and peak RSS over ``--seconds``.
  3. baseline           -- ``nvidia-smi --query-gpu=<same fields> --format=csv,noheader,nounits`` per sample,
                           CPU of the child plus parsing. Where nvidia-smi is absent a stand-in shell script
                           prints the same CSV: that measures process spawn only (the real nvidia-smi also
                           loads and initialises NVML on every call), so the real ratio is larger.
Targets: under 1 % of one core at 1 Hz for 8 GPUs, under 60 MB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpu_efficiency.agent.nvml.real import PynvmlBackend
from gpu_efficiency.agent.nvml.types import NvmlBackend, NvmlError
from gpu_efficiency.agent.runtime import Agent, AgentConfig
from gpu_efficiency_sim.fake_nvml.scenario import build_fake
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL

# nvidia-smi's names for the fields the agent reads without GPM (nvidia-smi --help-query-gpu);
# nvidia-smi has no GPM fields in --query-gpu, so the baseline does less work than the agent.
SMI_FIELDS = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.free,memory.total,"
    "power.draw,power.limit,temperature.gpu,temperature.memory,clocks_event_reasons.active,ecc.mode.current,"
    "ecc.mode.pending,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,"
    "remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure,"
    "retired_pages.pending"
)
TARGET_CORE_PCT = 1.0
TARGET_RSS_MB = 60.0


def per_sample_cpu(backend: NvmlBackend, samples: int) -> tuple[float, int]:
    """CPU seconds per sampling round of every device, and the device count."""
    backend.init()  # raises NvmlError where there is no driver
    backend.shutdown()
    agent = Agent(backend, AgentConfig(node_name="bench", interval_s=1.0))
    if not agent.try_init():  # the sampler thread's init step, without the thread
        raise RuntimeError(agent.readiness()[1])
    agent.sample_once()
    agent.sample_once()  # GPM primed
    started = time.process_time()
    for _ in range(samples):
        agent.sample_once()
    spent = (time.process_time() - started) / samples
    devices = len(agent.views())
    agent.stop()
    return spent, devices


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _proc_peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def deployed_agent(gpus: int, seconds: float) -> tuple[float, float]:
    """(percent of one core, peak RSS MB) of the agent process at 1 Hz, scraped every 15 s."""
    port = _free_port()
    cmd = [sys.executable, "-m", "gpu_efficiency_sim.fake_nvml", "agent"]
    cmd += ["--fake-gpus", str(gpus), "--fake-profile", "compute-bound", "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/readyz", timeout=1).status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("agent did not become ready")
            time.sleep(0.1)
        time.sleep(2)  # past start-up
        cpu0, t0 = _proc_cpu_seconds(proc.pid), time.monotonic()
        next_scrape = t0
        while time.monotonic() - t0 < seconds:
            if time.monotonic() >= next_scrape:
                urllib.request.urlopen(f"{url}/metrics", timeout=5).read()
                next_scrape += 15
            time.sleep(0.2)
        cpu = _proc_cpu_seconds(proc.pid) - cpu0
        wall = time.monotonic() - t0
        return 100.0 * cpu / wall, _proc_peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stand_in(gpus: int, directory: str) -> str:
    """An ``nvidia-smi`` that prints a busy default-model GPU per line, as the real one would."""
    m, used = DEFAULT_MODEL, 62000
    line = (
        f"{{i}}, GPU-00000000-0000-0000-0000-00000000000{{i}}, {m.model_name}, 00000000:1{{i}}:00.0, 98, 45, "
        f"{used}, {m.fb_total_mib - used}, {m.fb_total_mib}, {0.91 * m.max_power_w:.2f}, {m.max_power_w:.2f}, "
        "68, 72, 0x0000000000000000, Enabled, Enabled, 0, 0, 0, 0, No, No, No"
    )
    path = Path(directory, "nvidia-smi")
    body = "\n".join(f"echo '{line.format(i=i)}'" for i in range(gpus))
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def baseline(command: list[str], calls: int) -> tuple[float, int]:
    """(CPU seconds per call incl. spawn and parsing, rows per call)."""
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self0 = time.process_time()
    rows = 0
    for _ in range(calls):
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        parsed = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
        rows = len(parsed)
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    per_call = (child_cpu + time.process_time() - self0) / calls
    return per_call, rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="in-process sampling rounds")
    parser.add_argument("--seconds", type=float, default=20.0, help="deployed-agent measurement")
    parser.add_argument("--calls", type=int, default=200, help="nvidia-smi calls")
    args = parser.parse_args()

    print(f"node agent cost, {args.gpus} GPUs, every field (incl. GPM), 1 sample/s")
    fake, _ = build_fake("bench", gpus=args.gpus, profile="compute-bound")
    fake_cpu, devices = per_sample_cpu(fake, args.samples)
    rows = [("agent, fake NVML, per sample", fake_cpu, devices)]
    real_note = ""
    try:
        real_cpu, real_devices = per_sample_cpu(PynvmlBackend(), max(50, args.samples // 20))
        rows.append((f"agent, real NVML ({real_devices} GPUs), per sample", real_cpu, real_devices))
    except NvmlError as exc:
        real_note = f"real NVML: not measured ({exc})"

    smi = shutil.which("nvidia-smi")
    with tempfile.TemporaryDirectory() as tmp:
        if smi:
            command, label = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"], "nvidia-smi"
        else:
            command, label = [_stand_in(args.gpus, tmp)], "STAND-IN for nvidia-smi (spawn cost only)"
        base_cpu, base_rows = baseline(command, args.calls)

    core_pct, rss = deployed_agent(args.gpus, args.seconds)

    print(f"{'method':52} {'CPU ms/sample':>14} {'% core @1Hz':>12} {'baseline/this':>14}")
    for name, cpu, _n in rows:
        print(f"{name:52} {cpu * 1e3:14.3f} {cpu * 100:12.4f} {base_cpu / cpu:13.1f}x")
    print(f"{'baseline: ' + label:52} {base_cpu * 1e3:14.3f} {base_cpu * 100:12.4f} {1.0:13.1f}x")
    print(
        f"  baseline: {base_rows} CSV rows per call, {args.calls} calls; no GPM fields (nvidia-smi has none)"
    )
    if not smi:
        print("  NOTE: no nvidia-smi here: the baseline is a /bin/sh script printing the same CSV;")
        print("        real nvidia-smi also initialises NVML on every call, so the real ratio is larger.")
    if real_note:
        print(f"  {real_note}")
    verdict = {True: "OK", False: "OVER"}
    print(f"agent process (fake, {args.gpus} GPUs, 1 Hz, /metrics every 15 s, {args.seconds:.0f} s):")
    cpu_ok = verdict[core_pct < TARGET_CORE_PCT]
    print(f"  CPU {core_pct:.3f} % of one core (target < {TARGET_CORE_PCT} %): {cpu_ok}")
    print(f"  peak RSS {rss:.1f} MB (target < {TARGET_RSS_MB:.0f} MB): {verdict[rss < TARGET_RSS_MB]}")
    print(f"  devices sampled in-process: {devices}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
