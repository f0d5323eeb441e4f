"""The chart's series for one pod, read from Prometheus through the policy's own source (the same
URL, credentials and label matchers as the cycle): one subquery per signal, three in all.

Every dcgm-exporter generation's name and pod-label family is asked for (``or``), as the cycle
does; the pod's peak over its GPUs is drawn. This is a picture for a person, not a verdict: the
verdict and the deadline come from the pod's annotations the engine wrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpu_efficiency.selfservice.chart import Series
from gpu_efficiency.sources.metrics.base import SampleSource, SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus import PrometheusSource

#: Points per line: enough for a 640-pixel chart, few enough for a quick answer.
POINTS = 120
MIN_STEP_S = 15.0
MIB_PER_GIB = 1024.0


@dataclass(frozen=True, slots=True)
class Evidence:
    step_s: float
    series: dict[str, Series] = field(default_factory=dict)
    memory: Series = ()
    error: str = ""


def prometheus_of(source: object) -> PrometheusSource | None:
    """The Prometheus source inside a policy's source (combined with node agents, or without credentials)."""
    for _ in range(4):
        if isinstance(source, PrometheusSource):
            return source
        source = getattr(source, "prometheus", None) or getattr(source, "source", None)
    return None


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(metric: str, namespace: str, pod: str, matchers: str) -> str:
    """The pod's series of ``metric`` under each pod-label family, with the operator's matchers."""
    extra = f",{matchers}" if matchers else ""
    ns, name = _quote(namespace), _quote(pod)
    families = (("namespace", "pod"), ("exported_namespace", "exported_pod"), ("pod_namespace", "pod_name"))
    return " or ".join(f'{metric}{{{n}="{ns}",{p}="{name}"{extra}}}' for n, p in families)


def queries(namespace: str, pod: str, matchers: str) -> dict[str, str]:
    """Signal name -> PromQL (instant values; the caller wraps each in a subquery)."""

    def peak(*metrics: str, scale: str = "") -> str:
        return " or ".join(f"max({selector(m, namespace, pod, matchers)}){scale}" for m in metrics)

    return {
        "SM activity": peak(
            "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
        ),
        "GPU utilization": f"({peak('DCGM_FI_DEV_GPU_UTIL', scale=' / 100')}) or "
        f"({peak('DCGM_FI_DEV_GPU_UTIL_RATIO')})",
        "memory": peak("DCGM_FI_DEV_FB_USED"),
    }


def _matrix(chunks: Iterator[bytes]) -> Series:
    body: Any = orjson.loads(b"".join(chunks))
    if body.get("status") != "success":
        raise SourceUnavailable(f"Prometheus refused the query: {body.get('error', 'unknown error')}")
    result = body.get("data", {}).get("result") or []
    points: list[tuple[float, float]] = []
    for row in result[:1]:
        for t, v in row.get("values") or []:
            value = float(v)
            if math.isfinite(value):
                points.append((float(t), value))
    return points


def read_evidence(
    source: SampleSource, *, namespace: str, pod: str, window_s: float, now: float, matchers: str
) -> Evidence:
    """The pod's series over the window ending ``now``; ``error`` says why there are none."""
    step = max(MIN_STEP_S, math.ceil(window_s / POINTS))
    prometheus = prometheus_of(source)
    if prometheus is None:
        return Evidence(step, error="the policy reads no Prometheus")
    series: dict[str, Series] = {}
    memory: Series = ()
    try:
        for name, text in queries(namespace, pod, matchers).items():
            points = prometheus.client.exchange(f"({text})[{int(window_s)}s:{int(step)}s]", now, _matrix)
            if name == "memory":
                memory = [(t, v / MIB_PER_GIB) for t, v in points]
            else:
                series[name] = points
    except (SourceUnavailable, ValueError) as exc:
        return Evidence(step, error=str(exc)[:300])
    return Evidence(step, series, memory)
