"""Steady-cycle fetch with the tiered activity refresh, against a running scale cluster (issue 7).

    source /tmp/scalework/env.sh; eval "$(hack/localcluster/cluster.sh env)"
    python bench/scale/tiered_fetch.py --budgets 0,500,1000 --cycles 5 --interval 30

For each budget, a fresh PrometheusSource runs ``--cycles`` fetches ``--interval`` seconds apart
(the first fills the cache) with the windows and thresholds of the default scale-bench policy, and
prints per cycle: fetch wall, the CPU seconds Prometheus and this process spent during it (Prometheus'
own ``process_cpu_seconds_total``, so its scrapes in that time count too), PromQL queries, GPUs
refreshed / carried / refreshing in the background after the fetch (how much longer that ran, and
the CPU seconds with it), the engine's activity verdicts (idle / busy / unknown) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))

from probe import prometheus_cpu  # this script's directory is on sys.path

from gpu_efficiency.engine.model import Window
from gpu_efficiency.engine.reclaim.activity import DataBounds, gpu_activity
from gpu_efficiency.sources.metrics.base import ActivityHints, FaultHints, FetchRequest
from gpu_efficiency.sources.metrics.prometheus import PrometheusConfig, PrometheusSource

WINDOWS = {
    Window.ACTIVITY: 120.0,
    Window.FAULT: 120.0,
    Window.THERMAL_HOLD: 120.0,
    Window.THERMAL_RECOVERY: 300.0,
}
IDLE_BELOW = 0.01


def verdicts(result_gpus: tuple, now: float) -> dict[str, int]:  # type: ignore[type-arg]
    counts = {"idle": 0, "busy": 0, "unknown": 0}
    for gpu in result_gpus:
        activity = gpu_activity(gpu, DataBounds(needed=120 / 15 * 0.6, oldest=now - 120))
        if not activity.known:
            counts["unknown"] += 1
        else:
            counts["idle" if activity.peak < IDLE_BELOW else "busy"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=os.environ.get("GPUEFF_PROMETHEUS_URL", "http://127.0.0.1:61090"))
    parser.add_argument("--budgets", default="0,500,1000")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        source = PrometheusSource(PrometheusConfig(url=args.url, timeout=120.0), refresh_budget=budget)
        for cycle in range(1, args.cycles + 1):
            started = time.time()
            request = FetchRequest(
                now=started,
                windows=WINDOWS,
                scrape_interval=15.0,
                hints=FaultHints(gpu_temperature_above=90, memory_temperature_above=95),
                activity=ActivityHints(idle_below=IDLE_BELOW),
            )
            load = os.getloadavg()
            prom0, own0 = prometheus_cpu(args.url), time.process_time()
            result = source.fetch(request)
            prom_cpu, own_cpu = prometheus_cpu(args.url) - prom0, time.process_time() - own0
            waited = time.monotonic()
            source.wait_refreshes(args.interval)  # the budget's background refresh (rule 4)
            refresh_s = time.monotonic() - waited
            prom_total, own_total = prometheus_cpu(args.url) - prom0, time.process_time() - own0
            row = {
                "budget": budget,
                "cycle": cycle,
                "wall_s": round(result.seconds, 2),
                "prometheus_cpu_s": round(prom_cpu, 2),
                "fetch_cpu_s": round(own_cpu, 2),
                "queries": result.queries,
                "gpus": len(result.gpus),
                "refreshed": result.refreshed,
                "carried": result.carried,
                "refreshing": result.refreshing,
                "refresh_after_s": round(refresh_s, 2),
                "with_refresh_cpu_s": {"prometheus": round(prom_total, 2), "fetch": round(own_total, 2)},
                **verdicts(result.gpus, started),
                "load": [round(x, 2) for x in load],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            time.sleep(max(0.0, started + args.interval - time.time()))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
