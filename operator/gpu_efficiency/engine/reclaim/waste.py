"""Idle GPU-hours and their estimated cost, from the policy's price table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.api.timefmt import parse_rfc3339
from gpu_efficiency.engine.params import normalise_model


def price_for(model: str, prices: Mapping[str, float], node_product: str = "") -> float:
    """Price of one GPU-hour: DCGM modelName, then the node's product label, then "default", else 0.

    ``prices`` has normalised keys (``params.normalise_model``), so spaces and dashes both match.
    """
    if not prices:
        return 0.0
    for key in (model, node_product):
        if key:
            price = prices.get(normalise_model(key))
            if price is not None:
                return price
    return prices.get("default", 0.0)


def elapsed_hours(last_evaluation_time: str, now: float, interval_s: float) -> float:
    """Hours since the previous cycle, capped at two intervals (a long outage is not all idle time).

    The first cycle (no previous time) counts one interval: the peak-over-window rule already saw the
    GPU idle for at least that long.
    """
    previous = parse_rfc3339(last_evaluation_time)
    seconds = interval_s if previous is None else min(max(0.0, now - previous), 2.0 * interval_s)
    return seconds / 3600.0


@dataclass(frozen=True, slots=True)
class Waste:
    idle_gpus: int
    idle_gpu_hours: float  # this cycle's increment
    per_hour: float  # cost per hour of the GPUs idle now
    cost: float  # this cycle's increment


def idle_waste(
    idle_gpu_models: Iterable[tuple[str, str]], prices: Mapping[str, float], hours: float
) -> Waste:
    """Cost of the idle GPUs, each given as (DCGM modelName, node product label)."""
    count = 0
    per_hour = 0.0
    cache: dict[tuple[str, str], float] = {}
    for key in idle_gpu_models:
        count += 1
        price = cache.get(key)
        if price is None:
            price = cache[key] = price_for(key[0], prices, key[1])
        per_hour += price
    return Waste(idle_gpus=count, idle_gpu_hours=count * hours, per_hour=per_hour, cost=per_hour * hours)
