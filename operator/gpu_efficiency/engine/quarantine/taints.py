"""The operator's node taint: ``gpuefficiency.io/gpu-fault=<kinds>:<effect>``.

Kubernetes requires taints to be unique by (key, effect), so two kinds held with the same effect
share one taint whose value lists them, worst first, joined by ``.`` (``ecc.xid:NoSchedule``); a
kind with another effect gets its own taint. A toleration on the key (``operator: Exists``)
tolerates them all. Only taints with our key are ever read as ours or changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_efficiency.api.names import FAULT_TAINT_KEY
from gpu_efficiency.engine.model import Taint
from gpu_efficiency.engine.quarantine.record import kind_order

SEPARATOR = "."


def split_kinds(value: str) -> tuple[str, ...]:
    """Kinds named by a taint value ('' yields none)."""
    return tuple(part for part in value.split(SEPARATOR) if part)


def join_kinds(kinds: Iterable[str]) -> str:
    """Canonical taint value: distinct kinds, worst first."""
    return SEPARATOR.join(sorted(set(kinds), key=kind_order))


def our_taints(taints: Iterable[Taint]) -> dict[str, str]:
    """Kind -> effect of every kind our taints carry on a node."""
    out: dict[str, str] = {}
    for taint in taints:
        if taint.key == FAULT_TAINT_KEY:
            for kind in split_kinds(taint.value):
                out.setdefault(kind, taint.effect)
    return out
