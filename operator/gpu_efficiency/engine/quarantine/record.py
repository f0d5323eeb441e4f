"""The node annotation ``gpuefficiency.io/faults``: the faults the operator holds on a node.

State lives in the cluster, not in memory (safety rule 6), so a restarted or second replica picks
up exactly where the last one stopped. The record is canonical JSON (sorted keys, no spaces), so an
unchanged record serialises to the same text and the steady state makes no write::

    {"baselines": {"xid": {"at": "2024-05-01T10:00:00Z", "gpus": {"GPU-1": {"xid": 79}}}},
     "faults": {"ecc": {"since": "...", "detected": "...", "tainted": true, "manualUntaint": false,
                        "releasing": false,
                        "gpus": [{"index": "0", "uuid": "GPU-1", "value": "dbe=3 (+1)",
                                  "fingerprint": {"dbe": 3}}]}}}

- ``faults``: one entry per kind. ``since`` is the first detection, ``detected`` the last time a
  *new* fault (new GPU or fingerprint beyond the recorded one) was seen. ``tainted`` says our taint
  was seen on the node; ``manualUntaint`` that someone removed it afterwards (respected until a new
  fault); ``releasing`` that the fault is over and only our taint's removal is still to confirm;
  ``drainSince`` (only while it runs) when the drain before a NoExecute taint began
  (``drain``), so a restarted operator keeps counting toward the drain timeout.
- ``baselines``: fingerprints of faults already recovered by hand, so the same values (an XID
  still in the gauge, a row-remap failure not yet reset) do not re-trigger.

Parsing never raises: a malformed record (edited by hand) is reported and treated as empty.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_efficiency.engine.quarantine.kinds import kind_of


@dataclass(frozen=True, slots=True)
class GpuFault:
    """One GPU at fault, as recorded at detection."""

    index: str
    uuid: str
    value: str
    fingerprint: Mapping[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How messages and status name the GPU."""
        return f"{self.index}:{self.uuid}" if self.index else self.uuid


@dataclass(frozen=True, slots=True)
class FaultEntry:
    """One fault kind held on a node."""

    since: str
    detected: str
    gpus: tuple[GpuFault, ...]
    tainted: bool = False
    manual_untaint: bool = False
    releasing: bool = False
    drain_since: str = ""  # when the drain before a NoExecute taint began ('' when none runs)

    @property
    def held(self) -> bool:
        """Still a fault (a releasing entry only waits for its taint's removal)."""
        return not self.releasing

    def gpu(self, uuid: str) -> GpuFault | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class Baseline:
    """Fingerprints per GPU UUID of a fault recovered by hand, and when that fault was detected."""

    at: str
    gpus: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class NodeFaultRecord:
    faults: Mapping[str, FaultEntry] = field(default_factory=dict)
    baselines: Mapping[str, Baseline] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.faults and not self.baselines

    def held(self) -> dict[str, FaultEntry]:
        """Entries that are still faults, by kind."""
        return {kind: entry for kind, entry in self.faults.items() if entry.held}


def _fingerprint(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ValueError("fingerprint is not an object")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"fingerprint {key} is not a number")
        out[str(key)] = float(value)
    return out


def _gpu(raw: Any) -> GpuFault:
    if not isinstance(raw, dict) or not isinstance(raw.get("uuid"), str):
        raise ValueError("gpu without uuid")
    return GpuFault(
        index=str(raw.get("index", "")),
        uuid=raw["uuid"],
        value=str(raw.get("value", "")),
        fingerprint=_fingerprint(raw.get("fingerprint", {})),
    )


def _entry(raw: Any) -> FaultEntry:
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus", []), list):
        raise ValueError("fault entry is not an object with a gpus list")
    return FaultEntry(
        since=str(raw.get("since", "")),
        detected=str(raw.get("detected", raw.get("since", ""))),
        gpus=tuple(_gpu(g) for g in raw.get("gpus", [])),
        tainted=raw.get("tainted") is True,
        manual_untaint=raw.get("manualUntaint") is True,
        releasing=raw.get("releasing") is True,
        drain_since=str(raw.get("drainSince") or ""),
    )


def _baseline(raw: Any) -> Baseline:
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), dict):
        raise ValueError("baseline is not an object with a gpus map")
    return Baseline(at=str(raw.get("at", "")), gpus={str(k): _fingerprint(v) for k, v in raw["gpus"].items()})


def parse_record(text: str | None) -> tuple[NodeFaultRecord, str]:
    """The record in ``text`` and '' , or an empty record and why ``text`` was unusable."""
    if not text:
        return NodeFaultRecord(), ""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        faults = {str(k): _entry(v) for k, v in (raw.get("faults") or {}).items()}
        baselines = {str(k): _baseline(v) for k, v in (raw.get("baselines") or {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        return NodeFaultRecord(), f"unreadable fault record ({exc}); starting from an empty one"
    return NodeFaultRecord(faults=faults, baselines=baselines), ""


def _num(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


def _dump_gpu(gpu: GpuFault) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "value": gpu.value,
        "fingerprint": {k: _num(v) for k, v in gpu.fingerprint.items()},
    }


def _dump_entry(entry: FaultEntry) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "since": entry.since,
        "detected": entry.detected,
        "tainted": entry.tainted,
        "manualUntaint": entry.manual_untaint,
        "releasing": entry.releasing,
        "gpus": [_dump_gpu(g) for g in sorted(entry.gpus, key=_gpu_order)],
    }
    if entry.drain_since:  # only while a drain runs: older records keep their text
        doc["drainSince"] = entry.drain_since
    return doc


def dump_record(record: NodeFaultRecord) -> str | None:
    """Canonical JSON of the record, or None when it is empty (the annotation is removed)."""
    if record.empty:
        return None
    doc: dict[str, Any] = {}
    if record.faults:
        doc["faults"] = {kind: _dump_entry(e) for kind, e in record.faults.items()}
    if record.baselines:
        doc["baselines"] = {
            kind: {"at": b.at, "gpus": {u: {k: _num(v) for k, v in fp.items()} for u, fp in b.gpus.items()}}
            for kind, b in record.baselines.items()
        }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _gpu_order(gpu: GpuFault) -> tuple[int, str, str]:
    return (int(gpu.index) if gpu.index.isdigit() else 1 << 30, gpu.index, gpu.uuid)


def sorted_gpus(gpus: tuple[GpuFault, ...]) -> tuple[GpuFault, ...]:
    """GPUs by numeric index, then UUID: the order messages and status use."""
    return tuple(sorted(gpus, key=_gpu_order))


def kind_order(kind: str) -> tuple[int, str]:
    """Known kinds by severity, then any other kind a newer operator wrote, by name."""
    known = kind_of(kind)
    return (known.severity if known is not None else 99, kind)


def merge_gpus(entry: FaultEntry, updates: tuple[GpuFault, ...]) -> tuple[GpuFault, ...]:
    """The entry's GPUs with ``updates`` replacing or joining them (matched by UUID)."""
    by_uuid = {g.uuid: g for g in entry.gpus}
    for gpu in updates:
        by_uuid[gpu.uuid] = gpu
    return sorted_gpus(tuple(by_uuid.values()))


def with_fingerprints(entry: FaultEntry, fingerprints: Mapping[str, Mapping[str, float]]) -> FaultEntry:
    """The entry with some GPUs' fingerprints replaced (value text kept)."""
    gpus = tuple(
        replace(g, fingerprint=fingerprints[g.uuid]) if g.uuid in fingerprints else g for g in entry.gpus
    )
    return replace(entry, gpus=gpus)
