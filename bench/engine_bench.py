"""Engine benchmark: verdicts and plan for 80,000 GPUs against decoding their Prometheus responses.

    python bench/engine_bench.py [--nodes 10000] [--gpus-per-node 8] [--repeat 3]

A cluster of ``nodes x gpus`` GPUs, one pod per GPU, with a realistic mix of the scenario profiles
(idle, compute-bound, memory-bound, input-starved, ... and 2 % of GPUs with metric gaps). It times
``plan_cycle`` (pod verdicts, lifecycle, budgets, status and the faults engine) on a cold cluster
(no annotations yet: every pod is written) and on the steady cluster that follows (nothing to
write), and, in the same run, the baseline: decoding the Prometheus instant-query JSON responses
that carry the same GPUs' readings, with ``sources.prometheus.decode_vector`` when it exists (else
``orjson.loads``). Only the decode call is timed, not building the bodies nor freeing the result.

Two wire formats of the same (window, signal, aggregation) set, the Prometheus source's query plan:

A. one response per (signal, aggregation), each series with dcgm-exporter's labels (gpu, UUID,
   device, modelName, Hostname, pod, namespace, container): the straightforward source;
B. the source's own format: one identity response with those labels, then one response per window
   whose series carry only UUID and an aggregation tag (fewer bytes: the stricter baseline).

Target: plan_cycle <= 1x the decode time (the whole cycle <= 2x decode). Exit status 1 if plan_cycle
is slower than decoding baseline A.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gpu_efficiency.api import names
from gpu_efficiency.api.policy import GPUEfficiencyPolicySpec
from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.model import (
    AnnotatePod,
    EvictPod,
    GPUSample,
    NamespaceView,
    NodeView,
    Plan,
    PodRef,
    PodView,
    Signal,
    Snapshot,
    Stats,
    Window,
)
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.quarantine.evaluate import evaluate_faults
from gpu_efficiency.engine.reclaim.judgememo import JudgeMemo
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL
from gpu_efficiency_sim.profiles import sample as profile_sample

try:  # the real source's decoder, once it exists
    from gpu_efficiency.sources.metrics.prometheus import decode_vector as _decode_vector

    DECODER: Callable[[bytes], Any] = _decode_vector
    DECODER_NAME = "gpu_efficiency.sources.metrics.prometheus.decode_vector"
except ImportError:
    DECODER = orjson.loads
    DECODER_NAME = "orjson.loads"

NOW = 1_700_000_000.0
MODEL = DEFAULT_MODEL.model_name
FB_TOTAL = float(DEFAULT_MODEL.fb_total_mib)
S = Signal

# The (signal, aggregation) pairs each window's Stats are filled from: the Prometheus source's own
# query plan when it is importable (the baseline then tracks the real source), else this copy.
_ACT = ("max", "avg", "count", "ts")
_CTR = ("min", "max", "last", "resets", "count", "ts")
_THERM = ("min", "max", "last", "count", "ts")
FALLBACK_PLAN: dict[Window, dict[Signal, tuple[str, ...]]] = {
    Window.ACTIVITY: {
        S.SM_ACTIVE: _ACT, S.GR_ENGINE_ACTIVE: _ACT, S.GPU_UTIL: (*_ACT, "stddev"),
        S.SM_OCCUPANCY: ("avg", "count"), S.TENSOR_ACTIVE: ("avg", "count"), S.DRAM_ACTIVE: ("avg", "count"),
        S.PCIE_RX_BYTES: ("avg", "max", "count"),
        S.NVLINK_RX_BYTES: ("avg", "count"), S.NVLINK_TX_BYTES: ("avg", "count"),
        S.FB_USED: ("avg", "max", "min", "last", "count"), S.FB_FREE: ("last", "count"),
        S.POWER: ("avg", "stddev", "count"), S.GPU_TEMP: ("max", "avg", "count"),
        S.CLOCK_EVENTS: ("last", "max", "min", "count"),
    },
    Window.FAULT: {
        S.ECC_DBE_VOLATILE: _CTR, S.REMAPPED_ROWS_UNCORRECTABLE: _CTR,
        S.XID: ("last", "changes", "min", "max", "count", "ts"),
        S.ROW_REMAP_FAILURE: ("max", "last", "count", "ts"),
        S.RETIRED_PAGES_PENDING: ("max", "last", "count", "ts"),
    },
    Window.THERMAL_HOLD: {S.GPU_TEMP: _THERM, S.MEMORY_TEMP: _THERM, S.CLOCK_EVENTS: _THERM},
    Window.THERMAL_RECOVERY: {S.GPU_TEMP: _THERM, S.MEMORY_TEMP: _THERM, S.CLOCK_EVENTS: _THERM},
}  # fmt: skip
try:
    from gpu_efficiency.sources.metrics.prometheus.promql import QUERY_PLAN

    PLAN_NAME = "gpu_efficiency.sources.metrics.prometheus.promql.QUERY_PLAN"
except ImportError:
    QUERY_PLAN = FALLBACK_PLAN
    PLAN_NAME = "bench fallback plan"
#: Stats field behind each aggregation name of the query plan.
FIELD = {"ts": "last_timestamp"}

# Profile -> share of GPUs; "metric-gap" is compute-bound with too few activity samples.
METRIC_GAP = "metric-gap"
PROFILE_MIX: list[tuple[str, float]] = [
    ("compute-bound", 0.30), ("idle", 0.12), ("input-starved", 0.10), ("memory-bound", 0.08),
    ("no-tensor-cores", 0.08), ("low-occupancy", 0.07), ("idle-holding-memory", 0.06),
    ("bursty-inference", 0.06), ("communication-bound", 0.05), ("fake-load", 0.05),
    ("thermal-throttled", 0.01), (METRIC_GAP, 0.02),
]  # fmt: skip
#: The activity window's signals, as the simulator's profiles read them (the catalogue, sampled).
WINDOW_SIGNALS = (
    S.SM_ACTIVE, S.GR_ENGINE_ACTIVE, S.GPU_UTIL, S.SM_OCCUPANCY, S.TENSOR_ACTIVE, S.DRAM_ACTIVE,
    S.PCIE_RX_BYTES, S.NVLINK_RX_BYTES, S.NVLINK_TX_BYTES, S.FB_USED, S.FB_FREE, S.POWER, S.GPU_TEMP,
    S.CLOCK_EVENTS,
)  # fmt: skip
WINDOW_SAMPLES, SAMPLE_STEP_S = 40, 15.0  # the activity window's expected samples, 10 minutes


def profile_window(profile: str, seed: int = 1) -> dict[Signal, tuple[float, float, float]]:
    """(avg, max, stddev) of each activity signal over one window of the catalogue's ``profile``."""
    readings = [
        profile_sample(profile, i * SAMPLE_STEP_S, seed, DEFAULT_MODEL) for i in range(WINDOW_SAMPLES)
    ]
    window = {}
    for signal in WINDOW_SIGNALS:
        values = [float(r[signal.value]) for r in readings]
        window[signal] = (statistics.fmean(values), max(values), statistics.pstdev(values))
    return window


def profile_windows() -> dict[str, dict[Signal, tuple[float, float, float]]]:
    """Each mixed profile's window, jittered per GPU by ``build_cluster``."""
    windows = {name: profile_window(name) for name, _ in PROFILE_MIX if name != METRIC_GAP}
    windows[METRIC_GAP] = windows["compute-bound"]
    return windows


def _stats(avg: float, peak: float, stddev: float, count: int, age: float) -> Stats:
    return Stats(avg=avg, max=peak, min=0.0, last=avg, count=count, last_timestamp=NOW - age, stddev=stddev)


def build_cluster(nodes: int, per_node: int, seed: int = 7) -> Snapshot:
    """``nodes x per_node`` GPUs, one pod each, profiles drawn from ``PROFILE_MIX``."""
    rng = random.Random(seed)
    windows = profile_windows()
    profiles = [name for name, _ in PROFILE_MIX]
    weights = [w for _, w in PROFILE_MIX]
    gpus: list[GPUSample] = []
    pods: list[PodView] = []
    node_views = []
    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        node_views.append(
            NodeView(node, {names.GPU_PRODUCT_LABEL: MODEL.replace(" ", "-")}, {}, (), (), per_node)
        )
        for i in range(per_node):
            profile = rng.choices(profiles, weights)[0]
            uuid = f"GPU-{n:05x}{i:03x}-1f2e-4d3c-8b9a-{rng.getrandbits(48):012x}"
            namespace = f"team-{(n * per_node + i) % 200:03d}"
            pod = f"job-{n:05d}-{i}"
            jitter = 1.0 + rng.uniform(-0.02, 0.02)
            activity: dict[Signal, Stats] = {}
            gap = profile == METRIC_GAP
            for signal, (avg, peak, sd) in windows[profile].items():
                count = 5 if gap and signal in (S.SM_ACTIVE, S.GR_ENGINE_ACTIVE, S.GPU_UTIL) else 40
                top = 100.0 if signal is S.GPU_UTIL else (1.0 if peak <= 1.0 else float("inf"))
                activity[signal] = _stats(min(avg * jitter, top), min(peak * jitter, top), sd, count, 10.0)
            fault = {
                S.ECC_DBE_VOLATILE: Stats(0.0, 0.0, 0.0, 0.0, 8, NOW - 10, first=0.0),
                S.REMAPPED_ROWS_UNCORRECTABLE: Stats(0.0, 0.0, 0.0, 0.0, 8, NOW - 10, first=0.0),
                S.ROW_REMAP_FAILURE: Stats(0.0, 0.0, 0.0, 0.0, 8, NOW - 10),
                S.RETIRED_PAGES_PENDING: Stats(0.0, 0.0, 0.0, 0.0, 8, NOW - 10),
                S.XID: Stats(0.0, 0.0, 0.0, 0.0, 8, NOW - 10),
            }
            temps = {
                S.GPU_TEMP: activity.get(S.GPU_TEMP, _stats(70.0, 74.0, 1.0, 8, 10.0)),
                S.MEMORY_TEMP: _stats(72.0, 75.0, 1.0, 8, 10.0),
                S.CLOCK_EVENTS: activity[S.CLOCK_EVENTS],
            }
            gpus.append(
                GPUSample(
                    node=node,
                    uuid=uuid,
                    index=str(i),
                    model=MODEL,
                    pods=(PodRef(namespace, pod, "main"),),
                    stats={
                        Window.ACTIVITY: activity,
                        Window.FAULT: fault,
                        Window.THERMAL_HOLD: temps,
                        Window.THERMAL_RECOVERY: temps,
                    },
                    expected_samples={Window.ACTIVITY: 40.0, Window.FAULT: 8.0, Window.THERMAL_HOLD: 8.0,
                                      Window.THERMAL_RECOVERY: 20.0},
                    fb_total_mib=FB_TOTAL,
                )
            )  # fmt: skip
            pods.append(
                PodView(
                    namespace=namespace,
                    name=pod,
                    uid=f"uid-{n}-{i}",
                    node=node,
                    phase="Running",
                    labels={"app": pod.rsplit("-", 1)[0]},
                    annotations={},
                    controller_kind="ReplicaSet" if i % 4 else "StatefulSet",
                    priority=0,
                    start_time=NOW - 86400 - rng.uniform(0, 86400),
                    gpu_request=1,
                )
            )
    spec = GPUEfficiencyPolicySpec.model_validate(
        {
            "mode": "Enforce",
            "idle": {"idle_for": "30m", "warning_period": "15m"},
            "price_per_gpu_hour": {MODEL.replace(" ", "-"): 4.0, "default": 2.0},
        }
    )
    status = GPUEfficiencyPolicyStatus(
        last_evaluation_time=format_rfc3339(NOW - 60), recent_evictions=[format_rfc3339(NOW - 900)]
    )
    return Snapshot(
        now=NOW,
        policy_name="cluster-idle-reclaim",
        policy=spec,
        status=status,
        generation=3,
        gpus=tuple(gpus),
        pods=tuple(pods),
        nodes=tuple(node_views),
        namespaces=tuple(NamespaceView(f"team-{k:03d}", {"tier": "ml"}) for k in range(200)),
        metrics_available=True,
        protected_namespaces=frozenset({"kube-system", "kube-public", "kube-node-lease", "gpu-efficiency"}),
    )


def _full_labels(sample: GPUSample) -> bytes:
    """dcgm-exporter's labels of one GPU series (as Prometheus returns them after aggregation)."""
    ref = sample.pods[0]
    return orjson.dumps(
        {
            "gpu": sample.index,
            "UUID": sample.uuid,
            "device": f"nvidia{sample.index}",
            "modelName": sample.model,
            "Hostname": sample.node,
            "pod": ref.name,
            "namespace": ref.namespace,
            "container": ref.container,
        }
    )


_STAMP = b"%.3f" % NOW


def _series(metric: bytes, value: float) -> bytes:
    text = b"NaN" if value != value else repr(value).encode()
    return b'{"metric":' + metric + b',"value":[' + _STAMP + b',"' + text + b'"]}'


def _vector(series: list[bytes]) -> bytes:
    return b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join(series) + b"]}}"


def _value(sample: GPUSample, window: Window, signal: Signal, agg: str) -> float | None:
    stats = sample.stats.get(window, {}).get(signal)
    if stats is None:
        return None  # no series: Prometheus returns nothing for a GPU without the metric
    value = getattr(stats, FIELD.get(agg, agg))
    return float("nan") if value is None else float(value)


def per_query_bodies(snapshot: Snapshot) -> Iterator[tuple[Window, bytes]]:
    """Baseline A: one response per (window, signal, aggregation), full dcgm-exporter labels per series."""
    labels = [_full_labels(sample) for sample in snapshot.gpus]
    for window, signals in QUERY_PLAN.items():
        for signal, aggs in signals.items():
            for agg in aggs:
                series = []
                for sample, metric in zip(snapshot.gpus, labels, strict=True):
                    value = _value(sample, window, signal, agg)
                    if value is not None:
                        series.append(_series(metric, value))
                yield window, _vector(series)


def source_bodies(snapshot: Snapshot) -> Iterator[tuple[Window | None, bytes]]:
    """Baseline B: the Prometheus source's wire format: one identity response with full labels, then one
    response per window whose series carry only UUID and the aggregation tag."""
    yield None, _vector([_series(_full_labels(sample), 1.0) for sample in snapshot.gpus])
    for window, signals in QUERY_PLAN.items():
        series = []
        for signal, aggs in signals.items():
            for agg in aggs:
                tag = f"{signal.name}:{agg}".encode()
                for sample in snapshot.gpus:
                    value = _value(sample, window, signal, agg)
                    if value is not None:
                        metric = b'{"UUID":"' + sample.uuid.encode() + b'","gpueff_agg":"' + tag + b'"}'
                        series.append(_series(metric, value))
        yield window, _vector(series)


@dataclass
class DecodeTiming:
    activity_s: float = 0.0  # identity + activity window
    total_s: float = 0.0
    bodies: int = 0
    series: int = 0
    size: int = 0


def time_decode(bodies: Iterable[tuple[Window | None, bytes]]) -> DecodeTiming:
    """Decode each body once; only the decode call is timed (not building bodies nor freeing results)."""
    timing = DecodeTiming()
    for window, body in bodies:
        start = time.perf_counter()
        decoded = DECODER(body)
        elapsed = time.perf_counter() - start
        timing.bodies += 1
        timing.series += len(decoded) if isinstance(decoded, list) else len(decoded["data"]["result"])
        timing.size += len(body)
        del decoded, body
        timing.total_s += elapsed
        if window in (None, Window.ACTIVITY):
            timing.activity_s += elapsed
    return timing


def apply_annotations(snapshot: Snapshot, plan: Plan, advance: float) -> Snapshot:
    """The next cycle's snapshot: the plan's annotations applied, evicted pods gone."""
    patches = {(a.namespace, a.name): a.annotations for a in plan.actions if isinstance(a, AnnotatePod)}
    evicted = {(a.namespace, a.name) for a in plan.actions if isinstance(a, EvictPod)}
    pods = []
    for pod in snapshot.pods:
        key = (pod.namespace, pod.name)
        if key in evicted:
            continue
        patch = patches.get(key)
        if patch:
            merged = dict(pod.annotations)
            for k, v in patch.items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
            pod = replace(pod, annotations=merged)
        pods.append(pod)
    return replace(snapshot, now=snapshot.now + advance, pods=tuple(pods), status=plan.status)


def timed(func: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` runs (GC settled before each) and the last result."""
    times = []
    result = None
    for _ in range(repeat):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def time_carried(steady: Snapshot, repeat: int) -> tuple[float, float, int]:
    """plan_cycle over carried activity windows (the tiered source's steady state: the same window
    objects every cycle, fault windows only for candidates, here none), without and with the judge
    memo warmed by one cycle; the memo's plan must be the plan without it."""
    gpus = tuple(
        replace(g, stats={Window.ACTIVITY: g.stats[Window.ACTIVITY]}, carried_newest=g.stats[Window.ACTIVITY][S.SM_ACTIVE].last_timestamp)
        for g in steady.gpus
    )  # fmt: skip
    carried = replace(steady, gpus=gpus)
    without_s, plain = timed(lambda: plan_cycle(carried), repeat)
    memo = JudgeMemo()
    plan_cycle(carried, memo)
    with_s, kept = timed(lambda: plan_cycle(carried, memo), repeat)
    if kept != plain:
        raise SystemExit("the judge memo changed the plan")
    return without_s, with_s, memo.hits


def time_steady(steady: Snapshot, repeat: int) -> tuple[float, Plan, float]:
    """plan_cycle and evaluate_faults on the same readings after the cold plan was applied."""
    steady_s, steady_plan = timed(lambda: plan_cycle(steady), repeat)
    faults_s, _ = timed(lambda: evaluate_faults(steady), repeat)
    return steady_s, steady_plan, faults_s


def _kinds(plan: Plan) -> str:
    counts: dict[str, int] = {}
    for action in plan.actions:
        counts[type(action).__name__] = counts.get(type(action).__name__, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    start = time.perf_counter()
    cold = build_cluster(args.nodes, args.gpus_per_node)
    gc.collect()
    gc.freeze()  # the snapshot lives for the whole run, as it does for one operator cycle
    n_gpus = len(cold.gpus)
    print(f"cluster: {args.nodes} nodes x {args.gpus_per_node} GPUs = {n_gpus} GPUs, {len(cold.pods)} pods "
          f"(built in {time.perf_counter() - start:.1f}s); python {sys.version.split()[0]}")  # fmt: skip

    cold_s, cold_plan = timed(lambda: plan_cycle(cold), args.repeat)
    steady = replace(apply_annotations(cold, cold_plan, 0.0), status=cold.status)
    steady_s, steady_plan, faults_s = time_steady(steady, args.repeat)
    carried_s, memo_s, kept = time_carried(steady, args.repeat)
    del steady
    gc.collect()
    tracemalloc.start()
    plan_cycle(cold)
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    verdicts = cold_plan.status.verdicts
    print(f"verdicts: idle {verdicts.idle}, underutilized {verdicts.underutilized}, "
          f"efficient {verdicts.efficient}, unknown {verdicts.unknown}")  # fmt: skip
    print(f"cold plan actions: {_kinds(cold_plan)}")
    print(f"steady plan actions: {_kinds(steady_plan)}")
    del cold_plan, steady_plan

    per_query = time_decode(per_query_bodies(cold))
    wire = time_decode(source_bodies(cold))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"decoder: {DECODER_NAME}; query plan: {PLAN_NAME}")
    for name, t in (("A per-(signal,agg) responses", per_query), ("B source wire format", wire)):
        print(f"decode {name:30s}: {t.total_s:7.3f} s  ({t.bodies} responses, {t.series / 1e6:.2f}M series, "
              f"{t.size / 2**20:.0f} MiB; identity+activity window {t.activity_s:.3f} s)")  # fmt: skip
    print(f"plan_cycle, cold (every pod annotated): {cold_s:7.3f} s  ({cold_s / n_gpus * 1e6:.1f} us/GPU)")
    print(
        f"plan_cycle, steady (no writes):         {steady_s:7.3f} s  ({steady_s / n_gpus * 1e6:.1f} us/GPU)"
    )
    print(f"  of which evaluate_faults:             {faults_s:7.3f} s")
    print(f"plan_cycle, steady, carried windows:    {carried_s:7.3f} s; with the judge memo {memo_s:.3f} s "
          f"({memo_s / carried_s:.2f}x, {kept} verdicts kept; same plan)")  # fmt: skip
    worst = max(cold_s, steady_s)
    for name, t in (("A", per_query), ("B", wire)):
        verdict = "met" if worst <= t.total_s else "NOT met"
        print(f"ratio plan_cycle / decode {name}: cold {cold_s / t.total_s:.2f}x, "
              f"steady {steady_s / t.total_s:.2f}x  (target <= 1x: {verdict})")  # fmt: skip
    pods_s = cold_s - faults_s
    print(f"pod engine alone (plan_cycle - faults) / decode of identity+activity window: "
          f"A {pods_s / per_query.activity_s:.2f}x, B {pods_s / wire.activity_s:.2f}x")  # fmt: skip
    print(f"peak memory: plan_cycle allocations (tracemalloc) {peak_bytes / 2**20:.0f} MiB; "
          f"process max RSS {rss_mib:.0f} MiB")  # fmt: skip
    return 0 if worst <= per_query.total_s else 1


if __name__ == "__main__":
    sys.exit(main())
