"""GPU fault quarantine: per-kind rules (ecc, xid, thermal), node state and record, breaker, taints.

``evaluate.evaluate_faults`` is the entry point the planner calls; nothing here reads pods.
"""
