"""Run the operator (``gpu-efficiency run ...``) as a real process, with a trace for the scale benchmark.

    python bench/scale/probe.py TRACE.jsonl run --prometheus-url ... --namespace ...

The operator code runs unchanged; this launcher only wraps a few functions before handing over to
``gpu_efficiency.cli.main`` and appends one JSON line per event to TRACE:

- ``api``: every Kubernetes API call made through the ``kubernetes`` client (method, path, status
  code, seconds to the response headers). Kopf's own aiohttp watch of the policies is not counted.
- ``prom``: every PromQL instant query (which query, seconds until Prometheus answered and for
  reading and decoding the answer, response bytes, series; ``bg``: the refresh budget's background
  fetch or the exporter inventory's after a cycle, not part of it).
- ``cycle``: one per evaluation cycle: wall time, process CPU time, time per phase (observe =
  node read, then the pod read alongside the Prometheus fetch; plan, apply, status), verdicts,
  actions, writes, queries, RSS and peak RSS, the judge memo's counts (``memo``: verdicts kept,
  pods judged, quiet pods not acted on again; zeros on a commit whose memo lacks a count); with
  ``GPUEFF_PROBE_PROMETHEUS_URL``, also the CPU seconds Prometheus spent meanwhile (its
  ``process_cpu_seconds_total``, scrapes included). Both
  processes' CPU totals at the cycle's start too, so that what a whole interval costs (background
  refresh included) is the difference between two cycles.
- ``mem``: RSS and peak RSS each time the peak has grown by 2 MiB (sampled every 0.2 s), so the
  moment the peak is reached can be matched with the cycles and the cache's LISTs.
- ``alloc`` (only with ``GPUEFF_PROBE_TRACEMALLOC=1``; slows the operator several times): after each
  cycle, the source lines whose live Python allocations grew or shrank most since the previous one,
  and the traced total: what a cycle leaves behind, to tell a leak from allocator high water.
- ``malloc`` (only with ``GPUEFF_PROBE_MALLOC=1``): after each cycle, RSS, pymalloc's arenas and the
  bytes in its allocated blocks (``sys._debugmallocstats``), then RSS again after glibc's
  ``malloc_trim(0)`` (which the probe then does every cycle): where the RSS is that no object holds.

With ``GPUEFF_PROBE_SAVE_PLANS=DIR``, the engine's inputs of the 3rd to 5th plans of the process (the
snapshot and the policy's memory, pickled before the plan is made) are saved as ``DIR/plan-N.pkl``,
for ``bench/plan_replay.py`` to time that very plan again, on any commit (those cycles are slower by
the pickling, ~0.5 s at 8,000 pods).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_PHASES: dict[str, dict[str, float] | None] = {"current": None}  # one cycle at a time, any thread
#: The threads whose queries run after a cycle (``FetchResult.then``): rule 4's refresh, the inventory's.
BACKGROUND_THREADS = ("prometheus-refresh", "prometheus-inventory")


def _emit(out: Any, record: dict[str, Any]) -> None:
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with _LOCK:
        out.write(line)
        out.flush()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _timed_phase(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            phases = _PHASES["current"]
            if phases is not None:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def _watch_peak(out: Any, step_kib: int = 2048, every: float = 0.2) -> None:
    """Emit a ``mem`` record whenever the peak RSS has grown by ``step_kib`` since the last one."""
    last = 0
    while True:
        hwm = _status_kib("VmHWM")
        if hwm - last >= step_kib:
            last = hwm
            _emit(out, {"k": "mem", "t": time.time(), "rss_kib": _status_kib("VmRSS"), "hwm_kib": hwm})
        time.sleep(every)


def install(trace_path: str) -> None:
    from kubernetes.client import rest

    from gpu_efficiency.actuators.apply import Applier
    from gpu_efficiency.actuators.status import StatusWriter
    from gpu_efficiency.runtime import cycle
    from gpu_efficiency.sources.kube.cluster import ClusterReader
    from gpu_efficiency.sources.kube.cluster_cache import CachedClusterReader
    from gpu_efficiency.sources.metrics import prometheus
    from gpu_efficiency.sources.metrics.prometheus import source as prom_source
    from gpu_efficiency.sources.metrics.prometheus import transport as prom_transport

    out = open(trace_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    threading.Thread(target=_watch_peak, args=(out,), name="peak-rss", daemon=True).start()

    original_rest_request = rest.RESTClientObject.request

    def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        code = 0
        try:
            response = original_rest_request(self, method, url, *args, **kwargs)
            code = int(getattr(response, "status", 0) or 0)
            return response
        except Exception as exc:
            code = int(getattr(exc, "status", 0) or 0)
            raise
        finally:
            path = url.split("://", 1)[-1]
            path = path[path.find("/") :] if "/" in path else "/"
            record: dict[str, Any] = {"k": "api", "t": t0, "s": round(time.time() - t0, 6)}
            record.update(m=method, p=path, c=code)
            try:  # which annotations a patch sets or removes; an event's reason
                body = kwargs.get("body") or (args[1] if len(args) > 1 else None) or {}
                if method == "PATCH":
                    record["keys"] = sorted((body.get("metadata") or {}).get("annotations") or {})
                elif method == "POST" and path.endswith("/events"):
                    record["reason"] = body.get("reason", "")
            except Exception:  # the trace must never break the operator
                record["keys"] = ["?"]
            _emit(out, record)

    rest.RESTClientObject.request = request  # type: ignore[method-assign]

    local = threading.local()
    original_prom_request = prom_transport.PrometheusClient._request
    original_iter = prom_source.iter_vector
    original_decode = prom_transport.decode_vector
    original_run_query = prom_source.PrometheusSource.run

    def request_(self: Any, text: str, at: float | None, limit: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original_prom_request(self, text, at, limit)
        finally:  # time to the response headers: Prometheus evaluates before it writes
            local.server = time.perf_counter() - t0

    def iter_vector(chunks: Any, *args: Any, **kwargs: Any) -> Any:
        def counted() -> Any:
            for chunk in chunks:
                local.bytes += len(chunk)
                yield chunk

        for items in original_iter(counted(), *args, **kwargs):
            local.series += len(items)
            yield items

    def decode(body: bytes) -> Any:
        result = original_decode(body)
        local.bytes += len(body)
        local.series += len(result)
        return result

    def run_query(self: Any, query: Any, at: float, *rest: Any) -> Any:
        local.server, local.bytes, local.series = 0.0, 0, 0
        t0 = time.time()
        p0 = time.perf_counter()
        ok = False
        try:
            result = original_run_query(self, query, at, *rest)
            ok = True
            return result
        finally:
            total = time.perf_counter() - p0
            kind = "candidates" if query.candidates else (query.window.value if query.window else "identity")
            _emit(
                out,
                {
                    "k": "prom",
                    "t": t0,
                    "q": kind,
                    "s": round(total, 6),
                    "http": round(local.server, 6),
                    "decode": round(total - local.server, 6),
                    "bytes": local.bytes,
                    "series": local.series,
                    "ok": ok,
                    "chars": len(query.text),
                    "bg": threading.current_thread().name in BACKGROUND_THREADS,
                },
            )

    # Where the split Prometheus source (sources/metrics/prometheus/) looks these names up.
    prom_transport.PrometheusClient._request = request_  # type: ignore[method-assign]
    prom_source.iter_vector = iter_vector
    prom_transport.decode_vector = decode
    prom_source.PrometheusSource.run = run_query  # type: ignore[method-assign]

    ClusterReader.read_nodes = _timed_phase("read_nodes", ClusterReader.read_nodes)  # type: ignore[method-assign]
    ClusterReader.read_pods = _timed_phase("read_pods", ClusterReader.read_pods)  # type: ignore[method-assign]
    # The watch cache (the default): its reads, LIST fallbacks included (they call list_*, not read_*).
    CachedClusterReader.read_nodes = _timed_phase("read_nodes", CachedClusterReader.read_nodes)  # type: ignore[method-assign]
    CachedClusterReader.read_pods = _timed_phase("read_pods", CachedClusterReader.read_pods)  # type: ignore[method-assign]
    prometheus.PrometheusSource.fetch = _timed_phase("fetch", prometheus.PrometheusSource.fetch)  # type: ignore[method-assign]
    cycle.CycleRunner.observe = _timed_phase("observe", cycle.CycleRunner.observe)  # type: ignore[method-assign]
    cycle.engine.plan = _timed_phase("plan", cycle.engine.plan)  # the engine's face, as the cycle calls it
    Applier.apply = _timed_phase("apply", Applier.apply)  # type: ignore[method-assign]
    StatusWriter.write = _timed_phase("status", StatusWriter.write)  # type: ignore[method-assign]

    original_run = cycle.CycleRunner.run
    prometheus_url = os.environ.get("GPUEFF_PROBE_PROMETHEUS_URL", "")

    def run(self: Any, **kwargs: Any) -> Any:
        _PHASES["current"] = {}
        prom0 = prometheus_cpu(prometheus_url)
        t0, p0, c0 = time.time(), time.perf_counter(), os.times()
        report = None
        try:
            report = original_run(self, **kwargs)
            return report
        finally:
            c1 = os.times()
            phases = _PHASES["current"] or {}
            _PHASES["current"] = None
            plan = getattr(report, "plan", None)
            memo = getattr(getattr(self, "_memory", {}).get(kwargs.get("name", "")), "memo", None)
            _emit(
                out,
                {
                    "k": "cycle",
                    "policy": kwargs.get("name", ""),
                    "t0": t0,
                    "t1": time.time(),
                    "wall": round(time.perf_counter() - p0, 6),
                    "cpu": round((c1.user - c0.user) + (c1.system - c0.system), 4),
                    "prom_cpu": round(prometheus_cpu(prometheus_url) - prom0, 3),
                    "cpu_at": round(c0.user + c0.system, 3),  # both at the start: per-interval figures
                    "prom_cpu_at": prom0,
                    "phases": {k: round(v, 6) for k, v in phases.items()},
                    "ran": bool(getattr(report, "ran", False)),
                    "verdicts": len(plan.verdicts) if plan else 0,
                    "actions": len(plan.actions) if plan else 0,
                    "writes": int(getattr(report, "writes", 0)),
                    # the judge memo's last plan: verdicts kept and judged, quiet pods not acted on
                    "memo": [getattr(memo, n, 0) for n in ("hits", "misses", "quiet")],
                    "queries": int(getattr(report, "queries", 0)),
                    "rss_kib": _status_kib("VmRSS"),
                    "hwm_kib": _status_kib("VmHWM"),
                },
            )

    cycle.CycleRunner.run = run  # type: ignore[method-assign]
    if os.environ.get("GPUEFF_PROBE_TRACEMALLOC") == "1":
        _trace_allocations(out, cycle)
    if os.environ.get("GPUEFF_PROBE_MALLOC") == "1":
        _trace_malloc(out, cycle)
    if os.environ.get("GPUEFF_PROBE_SAVE_PLANS"):
        _save_plans(os.environ["GPUEFF_PROBE_SAVE_PLANS"], cycle)


#: Which plans of the process ``GPUEFF_PROBE_SAVE_PLANS`` saves: past a restart's first cycle and
#: the one after it, whose memo is still filling.
SAVED_PLANS = range(3, 6)


def _save_plans(directory: str, cycle: Any) -> None:
    """Wrap the engine's ``plan`` as the cycle calls it: pickle its inputs before SAVED_PLANS."""
    import pickle

    os.makedirs(directory, exist_ok=True)
    planned = cycle.engine.plan
    calls = [0]

    def plan(snapshot: Any, memory: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] in SAVED_PLANS:
            with open(os.path.join(directory, f"plan-{calls[0]}.pkl"), "wb") as saved:
                pickle.dump((snapshot, memory), saved, protocol=pickle.HIGHEST_PROTOCOL)
        return planned(snapshot, memory, **kwargs)

    cycle.engine.plan = plan


def prometheus_cpu(urls: str) -> float:
    """The backend's own ``process_cpu_seconds_total`` (NaN without a URL or an answer): read at both
    ends of a cycle, it is what the cycle's queries cost Prometheus, its scrapes meanwhile included.
    A comma list of URLs adds up the processes (a VictoriaMetrics cluster: vmselect, vminsert,
    vmagent and each vmstorage)."""
    if not urls:
        return math.nan
    total = 0.0
    for url in urls.split(","):
        total += _process_cpu(url)
    return total


def _process_cpu(url: str) -> float:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("process_cpu_seconds_total "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return math.nan


def _pymalloc_stats() -> dict[str, int]:
    """Arenas and allocated-block bytes from ``sys._debugmallocstats`` (it writes to fd 2)."""
    import tempfile

    with tempfile.TemporaryFile() as tmp, _LOCK:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    stats = {}
    for line in text.splitlines():
        for key, name in (
            ("# arenas allocated current", "arenas"),
            ("# bytes in allocated blocks", "blocks"),
        ):
            if line.startswith(key):
                stats[name] = int(line.split("=")[1].replace(",", "").strip())
    return stats


def _trace_malloc(out: Any, cycle: Any) -> None:
    """Wrap ``CycleRunner.run`` again: a ``malloc`` record after each cycle, then ``malloc_trim``."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    measured_run = cycle.CycleRunner.run

    def run(self: Any, **kwargs: Any) -> Any:
        try:
            return measured_run(self, **kwargs)
        finally:
            record: dict[str, Any] = {"k": "malloc", "t": time.time(), "rss_kib": _status_kib("VmRSS")}
            record.update(_pymalloc_stats())
            libc.malloc_trim(0)
            record["rss_trimmed_kib"] = _status_kib("VmRSS")
            _emit(out, record)

    cycle.CycleRunner.run = run


def _trace_allocations(out: Any, cycle: Any) -> None:
    """Wrap ``CycleRunner.run`` again: an ``alloc`` record of what each cycle left allocated."""
    tracemalloc.start()
    previous: list[tracemalloc.Snapshot] = []
    traced_run = cycle.CycleRunner.run

    def run(self: Any, **kwargs: Any) -> Any:
        try:
            return traced_run(self, **kwargs)
        finally:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            current, peak = tracemalloc.get_traced_memory()
            top = snapshot.compare_to(previous[0], "lineno")[:12] if previous else []
            previous[:] = [snapshot]
            _emit(
                out,
                {
                    "k": "alloc",
                    "t": time.time(),
                    "traced_kib": current // 1024,
                    "traced_peak_kib": peak // 1024,
                    "top": [[str(s.traceback), s.size_diff // 1024, s.size // 1024] for s in top],
                },
            )
            tracemalloc.reset_peak()

    cycle.CycleRunner.run = run


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    install(sys.argv[1])
    from gpu_efficiency.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
