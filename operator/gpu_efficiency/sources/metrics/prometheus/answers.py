"""The small answers of a fetch: GPU identities, fault candidates and idle candidates.

Series naming a malformed GPU identifier are dropped and counted: listed in a later query's regex,
one of them used to make Prometheus reject the whole fetch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_efficiency.engine import DropReason
from gpu_efficiency.engine.model import PodRef, Window
from gpu_efficiency.sources.metrics.base import DropTally
from gpu_efficiency.sources.metrics.labels import (
    GPUKey,
    node_of,
    pod_of,
    raw_key_of,
    valid_key,
)
from gpu_efficiency.sources.metrics.prometheus.promql import CANDIDATE_LABEL, FILTERED_WINDOWS, TARGET_LABEL

NAN = math.nan


def candidates(
    series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally
) -> dict[Window, set[tuple[str, str]]]:
    """The candidates query's answer: per filtered window, the (UUID, GPU_I_ID) keys to fetch."""
    windows = {w.value: w for w in FILTERED_WINDOWS}
    out: dict[Window, set[tuple[str, str]]] = {}
    for labels, _ in series:
        window = windows.get(labels.get(CANDIDATE_LABEL, ""))
        uuid = labels.get("UUID")
        if window is None or not uuid:
            continue
        if not valid_key(uuid, labels.get("GPU_I_ID", "")):
            drops.add(DropReason.INVALID_ID)
            continue
        out.setdefault(window, set()).add((uuid, labels.get("GPU_I_ID", "")))
    return out


def idle_keys(series: Iterable[tuple[Mapping[str, str], float]], drops: DropTally) -> set[tuple[str, str]]:
    """The idle-candidates query's answer: the (UUID, GPU_I_ID) keys it names."""
    out: set[tuple[str, str]] = set()
    for labels, _ in series:
        key = (labels.get("UUID", ""), labels.get("GPU_I_ID", ""))
        if valid_key(*key):
            out.add(key)
        else:
            drops.add(DropReason.INVALID_ID)
    return out


@dataclass
class Claim:
    """What one scrape target says of a GPU: its node and the pods it attributes to it."""

    node: str = ""
    pods: set[PodRef] = field(default_factory=set)


@dataclass
class Identity:
    node: str = ""
    index: str = ""
    model: str = ""
    pods: set[PodRef] = field(default_factory=set)
    newest: float = NAN  # largest series value: the newest sample time with identity_query(timestamps=True)
    labels: frozenset[str] = frozenset()  # while no series names the node: the labels they carry
    #: Per scrape target (its ``instance``): what it reports (``sources/metrics/targets.py`` decides which to believe).
    claims: dict[str, Claim] = field(default_factory=dict)
    #: Targets named two nodes for this GPU: dropped (DropReason.NODE_CONFLICT) unless the targets decide it.
    conflict: bool = False


def identities(
    series: Iterable[tuple[dict[str, str], float]], drops: DropTally | None = None
) -> dict[GPUKey, Identity]:
    """One identity per GPU from the identity query's series (one per GPU, target and attributed
    pod). Malformed identifiers are dropped and counted; a GPU claimed by two nodes is marked
    ``conflict`` (``samples`` drops it, unless the targets' own nodes say which claim is true)."""
    out: dict[GPUKey, Identity] = {}
    drops = drops if drops is not None else DropTally()
    for labels, value in series:
        key = raw_key_of(labels)
        if key is None:
            continue
        if not valid_key(key.uuid, key.instance_id):
            drops.add(DropReason.INVALID_ID)
            continue
        node = node_of(labels)
        ident = out.get(key)
        if ident is None:
            ident = out[key] = Identity(
                node=node, index=labels.get("gpu", ""), model=labels.get("modelName", "")
            )
        elif node and node != ident.node:
            if ident.node:
                ident.conflict = True
            else:
                ident.node = node
        if not ident.node:
            ident.labels = ident.labels | {k for k, v in labels.items() if v}
        target = labels.get(TARGET_LABEL, "")
        claim = ident.claims.get(target)
        if claim is None:
            claim = ident.claims[target] = Claim(node=node)
        elif node and node != claim.node:
            if claim.node:
                ident.conflict = True
            else:
                claim.node = node
        pod = pod_of(labels)
        if pod is not None:
            ident.pods.add(pod)
            claim.pods.add(pod)
        if math.isfinite(value) and not value <= ident.newest:  # max, NaN-safe
            ident.newest = value
    return out
