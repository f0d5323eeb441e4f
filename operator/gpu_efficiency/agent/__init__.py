"""The per-node GPU agent (``gpu-efficiency agent``): NVML readings, fault events, pod attribution, and
dcgm-exporter-compatible ``/metrics`` plus a ``/snapshot`` the operator's node-agent source reads.

Layout: ``nvml/`` (the NVML interface and the real backend; the fake
one is the harness's, ``gpu_efficiency_sim.fake_nvml``), ``collect`` (one reading per GPU), ``faults``
(event thread), ``pods`` (attribution), ``history`` (rolling window), ``runtime`` (the process),
``exposition``/``snapshot``/``server`` (outputs), ``nodecondition`` (optional GPUHealthy), ``cli``.
"""
