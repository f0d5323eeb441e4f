"""The node fault record (annotation JSON), taint values, and fingerprint novelty."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as s

from gpu_efficiency.engine.model import Taint
from gpu_efficiency.engine.quarantine.kinds import FaultKind, GpuJudgement, GpuState
from gpu_efficiency.engine.quarantine.novelty import is_new, lowered
from gpu_efficiency.engine.quarantine.record import (
    Baseline,
    FaultEntry,
    GpuFault,
    NodeFaultRecord,
    dump_record,
    parse_record,
)
from gpu_efficiency.engine.quarantine.taints import join_kinds, our_taints, split_kinds

T0 = "2023-11-14T22:13:20Z"


def test_round_trip_is_canonical() -> None:
    record = NodeFaultRecord(
        faults={
            "xid": FaultEntry(T0, T0, (GpuFault("1", "GPU-b", "xid=79", {"xid": 79.0}),), tainted=True),
            "ecc": FaultEntry(
                T0,
                T0,
                (
                    GpuFault("10", "GPU-z", "dbe=1", {"dbe": 1.0}),
                    GpuFault("2", "GPU-a", "dbe=2", {"dbe": 2.5}),
                ),
                manual_untaint=True,
            ),
        },
        baselines={"thermal": Baseline(T0, {"GPU-a": {"gpuTemp": 97.0}})},
    )
    text = dump_record(record)
    assert text is not None
    parsed, problem = parse_record(text)
    assert problem == ""
    assert dump_record(parsed) == text
    doc = json.loads(text)
    assert [g["index"] for g in doc["faults"]["ecc"]["gpus"]] == ["2", "10"]
    assert doc["faults"]["ecc"]["gpus"][1]["fingerprint"] == {"dbe": 1}
    assert " " not in text


def test_empty_record_removes_the_annotation() -> None:
    assert dump_record(NodeFaultRecord()) is None
    assert parse_record(None) == (NodeFaultRecord(), "")


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"faults": {"ecc": 3}}',
        '{"faults": {"ecc": {"gpus": [{"index": "0"}]}}}',
        '{"faults": {"ecc": {"gpus": [{"uuid": "GPU-a", "fingerprint": {"dbe": "many"}}]}}}',
        '{"baselines": {"xid": {"at": "x", "gpus": []}}}',
    ],
)
def test_malformed_records_are_reported_not_raised(text: str) -> None:
    record, problem = parse_record(text)
    assert record.empty
    assert "unreadable fault record" in problem


@settings(max_examples=60, deadline=None)
@given(text=s.text(max_size=80))
def test_parsing_never_raises(text: str) -> None:
    parse_record(text)


def test_taint_values_list_kinds_worst_first() -> None:
    assert join_kinds(["thermal", "ecc", "xid", "ecc"]) == "ecc.xid.thermal"
    assert split_kinds("ecc.xid") == ("ecc", "xid")
    assert split_kinds("") == ()
    taints = [
        Taint("gpuefficiency.io/gpu-fault", "ecc.xid", "NoSchedule"),
        Taint("gpuefficiency.io/gpu-fault", "thermal", "PreferNoSchedule"),
        Taint("other/key", "ecc", "NoSchedule"),
    ]
    assert our_taints(taints) == {"ecc": "NoSchedule", "xid": "NoSchedule", "thermal": "PreferNoSchedule"}


def _j(
    kind: FaultKind, triggered: tuple[str, ...] = (), floors: dict[str, float] | None = None, **fp: float
) -> GpuJudgement:
    return GpuJudgement(
        kind, "n1", "GPU-a", "0", GpuState.FAULT, fingerprint=fp, floors=floors or {}, triggered=triggered
    )


@pytest.mark.parametrize(
    ("judgement", "reference", "at", "now", "expected"),
    [
        (_j(FaultKind.ECC, ("dbe",), dbe=3), None, None, 0, True),
        (_j(FaultKind.ECC, ("dbe",), dbe=3), {"dbe": 3}, 0, 0, False),
        (_j(FaultKind.ECC, ("dbe",), dbe=4), {"dbe": 3}, 0, 0, True),
        (_j(FaultKind.ECC, ("remapFailure",), dbe=9, remapFailure=1), {"remapFailure": 1}, 0, 0, False),
        (_j(FaultKind.ECC, ("remapFailure",), remapFailure=1), {"dbe": 2}, 0, 0, True),
        (_j(FaultKind.XID, ("xid",), xid=79), {"xid": 79}, 1000, 1100, False),
        (_j(FaultKind.XID, ("xid",), xid=79), {"xid": 79}, 1000, 1135, True),
        (_j(FaultKind.XID, ("xid",), xid=48), {"xid": 79}, 1000, 1010, True),
        (_j(FaultKind.THERMAL, ("gpuTemp",), gpuTemp=99), {"gpuTemp": 95}, 0, 10**6, False),
    ],
)
def test_novelty(
    judgement: GpuJudgement, reference: dict[str, float] | None, at: float | None, now: float, expected: bool
) -> None:
    assert is_new(judgement, reference, at, now=now, xid_memory_s=135) is expected


def test_counter_resets_lower_ecc_references() -> None:
    after_reboot = _j(FaultKind.ECC, (), floors={"dbe": 0.0, "remapFailure": 1.0}, dbe=0.0, remapFailure=1.0)
    assert lowered({"dbe": 5.0, "remapFailure": 1.0}, after_reboot) == {"remapFailure": 1.0}
    same = _j(FaultKind.ECC, ("dbe",), floors={"dbe": 0.0}, dbe=5.0)
    assert lowered({"dbe": 5.0}, same) == {"dbe": 5.0}  # the increase that was recovered is no reset
