"""The candidates filters' arithmetic evaluated by the real Prometheus (issue 7): the single
thermal clock-event comparison must name exactly the values with bit 3, 5 or 6 set."""

from __future__ import annotations

import httpx
import pytest

from gpu_efficiency.engine import faults_thermal
from gpu_efficiency.sources.promql import thermal_bits_expr, union

pytestmark = pytest.mark.e2e

VALUES = [*range(0, 256), 1000, 4095, 65536 + 8, 65536 + 16, 2**40 + 32, -1, -8, -104]


def test_thermal_bits_expression_in_prometheus(prometheus_url: str) -> None:
    tagged = [f'label_replace(vector({v}), "v", "{v}", "", "")' for v in VALUES]
    query = thermal_bits_expr(f"({union(tagged)})")
    response = httpx.post(f"{prometheus_url}/api/v1/query", data={"query": query}, timeout=30)
    response.raise_for_status()
    named = {int(series["metric"]["v"]) for series in response.json()["data"]["result"]}
    expected = {v for v in VALUES if v >= 0 and v & faults_thermal.THERMAL_BITS}
    assert named == expected
