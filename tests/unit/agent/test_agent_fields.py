"""The agent's copies of shared names stay equal to the operator's (the agent avoids importing them)."""

from __future__ import annotations

import subprocess
import sys

from gpu_efficiency.agent.fields import BY_KEY, FIELDS, HISTORY_SIGNALS, PROBE_FIELDS, XID_METRIC
from gpu_efficiency.agent.nodecondition import CONDITION_TYPE
from gpu_efficiency.agent.nvml.types import Probe
from gpu_efficiency.api import names
from gpu_efficiency.engine.model import Signal


def test_history_signals_are_exactly_the_engine_signals() -> None:
    assert set(HISTORY_SIGNALS) == {s.value for s in Signal}
    assert len(HISTORY_SIGNALS) == len(set(HISTORY_SIGNALS))


def test_every_engine_signal_is_produced() -> None:
    produced = {f.metric for f in FIELDS} | {XID_METRIC}
    assert {s.value for s in Signal} <= produced


def test_field_table_is_consistent() -> None:
    assert len(BY_KEY) == len(FIELDS)
    assert len({f.metric for f in FIELDS}) == len(FIELDS)
    assert all(PROBE_FIELDS[p] for p in Probe)  # every probe feeds a field


def test_condition_type_matches_public_name() -> None:
    assert CONDITION_TYPE == names.GPU_HEALTHY


def test_agent_runtime_does_not_import_pydantic() -> None:
    """The point of the copies: the DaemonSet process stays small (see agent/fields.py)."""
    code = (
        "import sys, gpu_efficiency.agent.cli, gpu_efficiency.agent.nvml.real;"
        "print('pydantic' in sys.modules, 'kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
