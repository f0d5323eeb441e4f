"""A scriptable NVML for the node agent's tests, benchmark and e2e hook (``gpu-efficiency-sim agent``).

``backend`` is the in-memory NVML, ``scenario`` plays a YAML of GPUs, faults and changes on it, and
``command`` is the agent command with the fake backend and its ``--fake-*`` flags.
"""
