"""DCGM-exporter simulator and scenario runner: GPU metrics for fake nodes, attributed to real pods.

``Simulator`` renders dcgm-exporter's /metrics for simulated GPUs (profiles, faults, pod labels);
``MetricsServer`` serves it; ``load_scenario``/``run_scenario`` validate and play scenario files
against a cluster. The CLI is ``gpu-efficiency-sim ...`` (see ``cli.py``).
"""
