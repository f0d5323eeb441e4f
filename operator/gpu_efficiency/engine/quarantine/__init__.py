"""GPU fault quarantine: per-kind rules (ecc, xid, thermal, pcie), node state and record, breaker,
taints, the drain before NoExecute, and single-GPU quarantine through DRA (``dra``).

``evaluate.evaluate_faults`` is the entry point the planner calls; nothing here reads pods.
"""
