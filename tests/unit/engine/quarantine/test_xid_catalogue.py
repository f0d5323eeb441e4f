"""The XID catalogue and the policy's choice by resolution class, with per-code overrides."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hs
from pydantic import ValidationError
from tests.unit.engine.quarantine.support import Cluster, gpu, node, of_type, policy, st
from tests.unit.positive_control import reached

from gpu_efficiency.api.policy import DEFAULT_CRITICAL_XIDS, DEFAULT_IGNORED_XIDS, XidFault, XidResolution
from gpu_efficiency.engine.model import SetNodeCondition, Signal, TaintNode
from gpu_efficiency.engine.quarantine.xid_catalogue import (
    CATALOGUE,
    XidChoice,
    explain,
    is_application,
    resolution,
)


def xid(code: int) -> dict[Signal, object]:
    return {Signal.XID: st(code, low=0, high=code, changes=1)}


def test_the_catalogue_covers_every_code_of_the_old_default_lists_and_nvidia_s_range() -> None:
    assert set(range(1, 163)) <= set(CATALOGUE)
    assert set(DEFAULT_CRITICAL_XIDS) | set(DEFAULT_IGNORED_XIDS) <= set(CATALOGUE)
    assert resolution(79) is XidResolution.REBOOT_NODE
    assert resolution(48) is XidResolution.RESET_GPU
    assert resolution(95) is XidResolution.RESET_GPU
    assert resolution(13) is XidResolution.RESTART_APP
    assert resolution(43) is XidResolution.IGNORE
    assert resolution(100000) is XidResolution.UNKNOWN


def test_by_default_the_reset_reboot_and_support_classes_taint_and_application_xids_do_not() -> None:
    choose = XidChoice(XidFault())
    hardware = [c for c in DEFAULT_CRITICAL_XIDS if c not in (63, 92, 94)]  # NVIDIA: ignore / restart-app
    assert all(choose(c) for c in hardware)
    assert not any(choose(c) for c in DEFAULT_IGNORED_XIDS)
    assert not any(choose(c) for c in (63, 92, 94, 0, 100000))


def test_a_policy_chooses_by_class() -> None:
    only_reboot = XidChoice(XidFault(taint_classes=[XidResolution.REBOOT_NODE]))
    assert only_reboot(79)
    assert not only_reboot(48)  # reset-gpu, not chosen
    with_app = XidChoice(XidFault(taint_classes=[XidResolution.RESTART_APP]))
    assert with_app(13)
    assert not with_app(79)


def test_per_code_overrides_win_and_ignored_beats_critical() -> None:
    choose = XidChoice(XidFault(critical=[94], ignored=[79, 94]))
    assert not choose(79)  # reboot class, but ignored
    assert not choose(94)  # in both lists: ignored wins
    assert XidChoice(XidFault(critical=[94]))(94)
    assert XidChoice(XidFault(taint_classes=[], critical=[31]))(31)
    assert not XidChoice(XidFault(taint_classes=[]))(79)


def test_messages_say_what_the_xid_means_and_what_to_do() -> None:
    text = explain(79)
    assert "fallen off the bus" in text
    assert "reboot" in text
    cluster = Cluster.of(node("n1"))
    outcome = cluster.cycle([gpu("n1", fault=xid(79))])
    (condition,) = of_type(outcome.actions, SetNodeCondition)
    assert "fallen off the bus" in condition.message
    assert "reboot the node" in condition.message


def test_taint_classes_in_a_policy_change_what_taints() -> None:
    default = Cluster.of(node("n1"))
    assert of_type(default.cycle([gpu("n1", fault=xid(94))]).actions, TaintNode) == []
    chosen = Cluster.of(node("n1"), spec=policy(xid={"taintClasses": ["restart-app"]}))
    assert of_type(chosen.cycle([gpu("n1", fault=xid(94))]).actions, TaintNode) == [
        TaintNode(node="n1", kind="xid", effect="NoSchedule")
    ]


def test_a_code_in_two_repeat_rules_is_rejected() -> None:
    with pytest.raises(ValidationError, match="more than one rule"):
        XidFault.model_validate({"repeat": [{"codes": [94], "count": 2}, {"codes": [94, 95], "count": 3}]})
    with pytest.raises(ValidationError):
        XidFault.model_validate({"taintClasses": ["reboot"]})


@given(hs.sampled_from(sorted(c for c in CATALOGUE if is_application(c))))
def test_no_application_class_xid_ever_taints_under_the_default_policy(code: int) -> None:
    cluster = Cluster.of(node("n1"))
    assert of_type(cluster.cycle([gpu("n1", fault=xid(code))]).actions, TaintNode) == []


def test_control_the_same_catalogue_s_other_classes_do_taint_under_the_default_policy() -> None:
    """The property above also holds if nothing ever taints: a code of the same catalogue outside
    the application class, in the same cluster and policy, must taint."""

    def taints(code: int) -> bool:
        cluster = Cluster.of(node("n1"))
        return bool(of_type(cluster.cycle([gpu("n1", fault=xid(code))]).actions, TaintNode))

    code = reached(hs.sampled_from(sorted(c for c in CATALOGUE if not is_application(c))), taints)
    assert not is_application(code)
