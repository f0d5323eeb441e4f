"""The engine's face: what every other layer may import from the engine (besides ``engine.model``).

A cycle calls three entry points, in order:

1. ``reads(spec, nodes=...)``: what to read (metric windows and hints, DRA objects, when owners).
2. ``plan(snapshot, memory, with_owners=...)``: the cycle's plan (``plan_cycle``), judged once more
   with the owners read when a pod's first idle annotation needs them.
3. ``settle(snapshot, plan, outcomes, notify=...)``: the outcomes folded into status, the
   notifications to offer, the events and the gauges; ``Settlement.close`` adds what depends on the
   delivery. ``settle_invalid`` settles a cycle whose spec did not parse.

The rest is vocabulary other layers share with the engine, kept short: ``merge_budgets`` (a
leadership term's first status merges the server's and this replica's), ``with_dra_capacity`` (a
node's GPUs counted from its DRA devices, for the snapshot), ``compile_selector`` (the fault wake
matches node labels the way policies select nodes); the front ends' helpers (report and explain run
the planner themselves, restore and keep read what the engine wrote); the rule constants the
metric sources query by, and the reasons the engine's trust checks drop samples for. The import-linter
contract "Callers use the engine's face" holds every other engine module private.
"""

from gpu_efficiency.engine.exporter_coverage import blind_summary, coverage, csv_lines, nodeless
from gpu_efficiency.engine.notify.messages import TITLES as NOTIFICATION_TITLES
from gpu_efficiency.engine.notify.messages import Notification
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import Memory, explain_pod, plan, plan_cycle
from gpu_efficiency.engine.quarantine.dra import with_dra_capacity
from gpu_efficiency.engine.quarantine.pcie import BUSY_UTIL_PERCENT
from gpu_efficiency.engine.reads import ReadPlan, reads
from gpu_efficiency.engine.reclaim.acknowledge import ending_with, parse_keep_for
from gpu_efficiency.engine.reclaim.activity import ACTIVITY_CHAIN, CONTRADICTION_UTIL, MAX_SMS_PER_GPU
from gpu_efficiency.engine.reclaim.budgets import merge_budgets
from gpu_efficiency.engine.reclaim.ownerreads import OwnerRead
from gpu_efficiency.engine.reclaim.owners import restore_commands
from gpu_efficiency.engine.reclaim.reclaimedbyus import reclaimed_by_us
from gpu_efficiency.engine.reclaim.waste import price_for
from gpu_efficiency.engine.selection import compile_selector
from gpu_efficiency.engine.settle import Gauges, Settlement, settle, settle_invalid
from gpu_efficiency.engine.trust import DropReason, merge_samples

__all__ = [
    "ACTIVITY_CHAIN",
    "BUSY_UTIL_PERCENT",
    "CONTRADICTION_UTIL",
    "MAX_SMS_PER_GPU",
    "NOTIFICATION_TITLES",
    "DropReason",
    "Gauges",
    "Memory",
    "Notification",
    "OwnerRead",
    "ReadPlan",
    "Settlement",
    "blind_summary",
    "compile_selector",
    "coverage",
    "csv_lines",
    "cycle_params",
    "ending_with",
    "explain_pod",
    "merge_budgets",
    "merge_samples",
    "nodeless",
    "parse_keep_for",
    "plan",
    "plan_cycle",
    "price_for",
    "reads",
    "reclaimed_by_us",
    "restore_commands",
    "settle",
    "settle_invalid",
    "with_dra_capacity",
]
