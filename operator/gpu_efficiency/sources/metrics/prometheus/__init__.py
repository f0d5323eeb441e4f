"""The Prometheus source, in modules by concern:

- ``transport``: the HTTP exchange (``PrometheusClient``: session, retries, TLS, credentials,
  form encoding, the wall-clock deadline of each query);
- ``vector``: instant-query answers decoded, whole or streamed, malformed ones refused;
- ``answers``: the identity, fault-candidates and idle-candidates answers;
- ``windows``: window answers folded into aggregate rows, then joined into GPUSamples;
- ``tiered``: the tiered fetch of the activity window (``--prometheus-refresh-budget``);
- ``source``: ``PrometheusSource``, the SampleSource running a cycle's queries.
"""

from gpu_efficiency.sources.metrics.prometheus.source import PrometheusSource
from gpu_efficiency.sources.metrics.prometheus.transport import PrometheusClient, PrometheusConfig, form_value
from gpu_efficiency.sources.metrics.prometheus.vector import decode_vector

__all__ = ["PrometheusClient", "PrometheusConfig", "PrometheusSource", "decode_vector", "form_value"]
