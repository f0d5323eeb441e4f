"""Price lookup and idle GPU-hour accounting."""

import pytest
from tests.unit.engine import builders as b
from tests.unit.engine.builders import (
    NOW,
    gpu,
    no_faults,  # noqa: F401 (fixture)
    node,
    pod,
    policy,
    snapshot,
)

from gpu_efficiency.api.status import GPUEfficiencyPolicyStatus
from gpu_efficiency.api.timefmt import format_rfc3339
from gpu_efficiency.engine.params import cycle_params
from gpu_efficiency.engine.planner import plan_cycle
from gpu_efficiency.engine.reclaim.waste import elapsed_hours, idle_waste, price_for

pytestmark = pytest.mark.usefixtures("no_faults")

PRICES = cycle_params(policy(price_per_gpu_hour={"NVIDIA-H100-80GB-HBM3": 4.0, "default": 1.5})).prices


@pytest.mark.parametrize(
    ("model", "product", "price"),
    [
        ("NVIDIA H100 80GB HBM3", "", 4.0),  # DCGM modelName matches the label form
        ("", "NVIDIA-H100-80GB-HBM3", 4.0),  # node product label
        ("Tesla T4", "", 1.5),  # default
    ],
)
def test_price_lookup(model: str, product: str, price: float) -> None:
    assert price_for(model, PRICES, product) == price


def test_no_price_table_costs_nothing() -> None:
    assert price_for("NVIDIA H100 80GB HBM3", {}) == 0.0
    assert price_for("x", cycle_params(policy(price_per_gpu_hour={"A100": 2.0})).prices) == 0.0


@pytest.mark.parametrize(
    ("last", "hours"),
    [
        ("", 60 / 3600),  # first cycle: one interval
        (format_rfc3339(NOW - 30), 30 / 3600),
        (format_rfc3339(NOW - 3600), 120 / 3600),  # capped at 2 x interval
        (format_rfc3339(NOW + 30), 0.0),  # clock skew
        ("garbage", 60 / 3600),
    ],
)
def test_elapsed_hours(last: str, hours: float) -> None:
    assert elapsed_hours(last, NOW, 60.0) == pytest.approx(hours)


def test_idle_waste() -> None:
    waste = idle_waste([("NVIDIA H100 80GB HBM3", ""), ("T4", ""), ("T4", "")], PRICES, 0.5)
    assert waste.idle_gpus == 3
    assert waste.idle_gpu_hours == pytest.approx(1.5)
    assert waste.per_hour == pytest.approx(7.0)
    assert waste.cost == pytest.approx(3.5)


def test_status_accumulates_idle_hours_and_waste() -> None:
    spec = policy(price_per_gpu_hour={"default": 2.0})
    previous = GPUEfficiencyPolicyStatus(
        last_evaluation_time=format_rfc3339(NOW - 60), idle_gpu_hours=10.0, estimated_waste_total=20.0
    )
    gpus = [
        gpu("GPU-0", b.idle(), ("team-a", "a"), node="n1"),
        gpu("GPU-1", b.idle(), ("team-a", "b"), node="n1"),
        gpu("GPU-2", b.compute_bound(), ("team-a", "c"), node="n1"),
    ]
    plan = plan_cycle(
        snapshot(gpus, [pod(n, node="n1") for n in "abc"], spec, status=previous, nodes=[node("n1")])
    )
    assert plan.status.idle_gpus == 2
    assert plan.status.idle_gpu_hours == pytest.approx(10.0 + 2 / 60)
    assert plan.status.estimated_waste_per_hour == pytest.approx(4.0)
    assert plan.status.estimated_waste_total == pytest.approx(20.0 + 4.0 / 60)
