"""``/snapshot``: every field of every GPU, faults, pods, recent events, history and window aggregates.

Schema ``gpuefficiency.io/agent-snapshot/v1`` (absent values are ``null``)::

    {schema, node, hostname, timestamp, interval_seconds, history_seconds, ready, reason, backend,
     driver_version, attribution: {source, error},
     gpus: [{index, uuid, name, model, pci_bus_id, mig: null | {parent_uuid, gpu_instance_id,
             compute_instance_id, profile}, timestamp, fields: {<key>: value}, unsupported: {<key>: error},
             faults: {last_xid, last_xid_time, xid_events, dbe_events, last_dbe_time}, events_error,
             pods: [{namespace, name, container, uid, container_id}],
             history?: {timestamps: [...], signals: {<dcgm name>: [...]}},
             stats?: {<window>: {<dcgm name>: {avg, max, min, last, count, last_timestamp, stddev,
                                               changes, resets, first}}}}],
     events: [{time, uuid, kind, data, gpu_instance_id}]}

History is columnar to stay small and returned only when asked for (``?history=SECONDS``); ``stats`` is computed here so the operator receives a few numbers per
signal instead of every sample (``?stats=activity=600,fault=120``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpu_efficiency.agent.faults import FaultEvent
from gpu_efficiency.agent.fields import FIELDS, MIG_PROBES
from gpu_efficiency.agent.history import History
from gpu_efficiency.agent.state import GpuView

SCHEMA = "gpuefficiency.io/agent-snapshot/v1"
_MIG_KEYS = tuple(f.key for f in FIELDS if f.probe in MIG_PROBES)
_ALL_KEYS = tuple(f.key for f in FIELDS)


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """What the caller asked for: history since a time (None: none) and window stats by name."""

    history_since: float | None = None
    stats_windows: Mapping[str, float] | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str], now: float) -> SnapshotRequest:
        """``history=SECONDS`` (default 0: none; ``inf``: all kept), ``stats=NAME=SECONDS,...``.

        Raw history is opt-in: it is the bulk of the answer and the operator needs only the stats."""
        history = float(query.get("history", "0"))
        stats: dict[str, float] = {}
        for item in filter(None, query.get("stats", "").split(",")):
            name, _, seconds = item.partition("=")
            stats[name.strip()] = float(seconds)
        if history < 0 or any(v <= 0 for v in stats.values()):
            raise ValueError("history and stats windows must be positive seconds")
        return cls(history_since=now - history if history > 0 else None, stats_windows=stats or None)


def gpu_document(
    view: GpuView, history: History | None, request: SnapshotRequest, now: float, events_error: str | None
) -> dict[str, Any]:
    r, d = view.reading, view.reading.device
    keys = _MIG_KEYS if d.is_mig else _ALL_KEYS
    doc: dict[str, Any] = {
        "index": d.label_index,
        "uuid": d.uuid,
        "name": d.name,
        "model": d.model,
        "pci_bus_id": d.pci_bus_id,
        "mig": None
        if not d.is_mig
        else {
            "parent_uuid": d.parent_uuid,
            "gpu_instance_id": d.gpu_instance_id,
            "compute_instance_id": d.compute_instance_id,
            "profile": d.mig_profile,
        },
        "timestamp": r.timestamp,
        "fields": {k: r.values.get(k) for k in keys},
        "unsupported": dict(r.failures),
        "faults": asdict(view.faults),
        "events_error": events_error,
        "pods": [asdict(p) for p in view.pods],
    }
    if history is not None and request.history_since is not None:
        timestamps, columns = history.window(request.history_since)
        doc["history"] = {"timestamps": timestamps, "signals": columns}
    if history is not None and request.stats_windows:
        doc["stats"] = {
            name: {sig: asdict(s) for sig, s in history.stats(now - seconds, now).items()}
            for name, seconds in request.stats_windows.items()
        }
    return doc


def event_document(e: FaultEvent) -> dict[str, Any]:
    return {
        "time": e.time,
        "uuid": e.uuid,
        "kind": e.kind.value,
        "data": e.data,
        "gpu_instance_id": e.gpu_instance_id,
    }


def build(
    *,
    header: Mapping[str, Any],
    views: Sequence[GpuView],
    histories: Mapping[str, History],
    events: Sequence[FaultEvent],
    events_errors: Mapping[str, str],
    request: SnapshotRequest,
    now: float,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        **header,
        "timestamp": now,
        "gpus": [
            gpu_document(
                v,
                histories.get(v.reading.device.uuid),
                request,
                now,
                events_errors.get(v.reading.device.parent_uuid or v.reading.device.uuid),
            )
            for v in views
        ],
        "events": [event_document(e) for e in events],
    }
