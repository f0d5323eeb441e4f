"""Pod judgement: activity, idleness and its lifecycle, underutilization, budgets, owner-aware reclaim.

Nothing here reads fault state; the planner combines both.
"""
