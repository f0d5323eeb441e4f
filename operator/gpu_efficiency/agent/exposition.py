"""``/metrics``: the GPU fields under dcgm-exporter's names and labels, plus the agent's own metrics.

Names, units and the node label are one dcgm-exporter generation's (``naming.py``, ``--exporter-names``).
Labels follow dcgm-exporter (gpu, UUID, pci_bus_id, device, modelName, hostname or Hostname, DCGM_FI_DRIVER_VERSION,
container, namespace, pod; GPU_I_PROFILE and GPU_I_ID on MIG devices, whose gpu/UUID are the parent's),
so Prometheus queries written for the exporter, and our Prometheus source, read the agent unchanged.
A GPU used by several containers gets one series per container, as the exporter does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_efficiency.agent.fields import BY_KEY, FIELDS, XID_METRIC
from gpu_efficiency.agent.naming import Naming, naming
from gpu_efficiency.agent.state import GpuView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "gpu_efficiency_agent_"

_HELP = {f.metric: f.help for f in FIELDS} | {XID_METRIC: "Value of the last XID error encountered."}
_ORDER = [f.metric for f in FIELDS] + [XID_METRIC]


@dataclass(frozen=True, slots=True)
class HostLabels:
    hostname: str
    driver_version: str


def series_labels(view: GpuView, host: HostLabels, node_label: str = "Hostname") -> list[dict[str, str]]:
    """One label set per container using the GPU (one with empty pod labels when none)."""
    d = view.reading.device
    base = {
        "gpu": str(d.index),
        "UUID": d.parent_uuid or d.uuid,
        "pci_bus_id": d.pci_bus_id,
        "device": f"nvidia{d.index}",
        "modelName": d.model,
        node_label: host.hostname,
        "DCGM_FI_DRIVER_VERSION": host.driver_version,
    }
    if d.is_mig:
        base["GPU_I_PROFILE"] = d.mig_profile or ""
        base["GPU_I_ID"] = str(d.gpu_instance_id)
    pods = view.pods or ()
    if not pods:
        return [base | {"container": "", "namespace": "", "pod": ""}]
    return [base | {"container": p.container, "namespace": p.namespace, "pod": p.name} for p in pods]


class DcgmCollector(Collector):
    """Renders the current GPU views at scrape time (so a fault event shows without waiting a sample)."""

    def __init__(
        self,
        views: Callable[[], Sequence[GpuView]],
        host: Callable[[], HostLabels],
        names: Naming | None = None,
    ) -> None:
        self._views = views
        self._host = host
        self._names = names or naming()

    def collect(self) -> Iterator[Metric]:
        host = self._host()
        families: dict[str, Metric] = {}
        unsupported = GaugeMetricFamily(
            PREFIX + "field_unsupported",
            "1 for each field NVML did not return for a GPU in the latest sample, with the NVML error.",
            labels=["gpu", "UUID", "field", "error"],
        )
        names = self._names
        for view in self._views():
            values = view.metric_values()
            label_sets = series_labels(view, host, names.node_label)
            for name in _ORDER:
                if name not in values:
                    continue
                served = names.name(name)
                value = names.value(name, values[name])
                family = families.get(name)
                if family is None:
                    family = families[name] = Metric(served, names.help(name, _HELP[name]), "gauge")
                for labels in label_sets:
                    family.add_sample(served, labels, value)
            d = view.reading.device
            for key, error in sorted(view.reading.failures.items()):
                if key in BY_KEY:
                    unsupported.add_metric([d.label_index, d.uuid, key, error], 1.0)
        yield from (families[n] for n in _ORDER if n in families)
        yield unsupported


class AgentMetrics:
    """The registry behind ``/metrics``: dcgm-compatible GPU series and the agent's self-metrics."""

    def __init__(
        self,
        views: Callable[[], Sequence[GpuView]],
        host: Callable[[], HostLabels],
        names: Naming | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.nvml_ready = Gauge(PREFIX + "nvml_ready", "1 when NVML is initialised and sampling.", registry=r)
        self.nvml_init_failures = Counter(
            PREFIX + "nvml_init_failures", "NVML initialisations that failed.", registry=r
        )
        self.samples = Counter(PREFIX + "samples", "Sampling rounds over all GPUs.", registry=r)
        self.sample_seconds = Histogram(
            PREFIX + "sample_duration_seconds",
            "Wall time of one sampling round over all GPUs.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.last_sample = Gauge(
            PREFIX + "last_sample_timestamp_seconds", "Unix time of the latest sample.", registry=r
        )
        self.gpus = Gauge(PREFIX + "gpus", "Devices sampled (GPUs and MIG devices).", registry=r)
        self.events = Counter(PREFIX + "nvml_events", "NVML fault events received.", ["kind"], registry=r)
        self.attribution_errors = Counter(
            PREFIX + "attribution_errors", "Pod attribution attempts that fell back or failed.", registry=r
        )
        self.node_condition_writes = Counter(
            PREFIX + "node_condition_writes", "GPUHealthy node condition patches.", ["result"], registry=r
        )
        r.register(DcgmCollector(views, host, names))

    def render(self) -> bytes:
        return generate_latest(self.registry)
