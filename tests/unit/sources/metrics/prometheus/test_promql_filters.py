"""The candidates filters' PromQL arithmetic, modelled with Prometheus' float semantics (Go's
``math.Mod`` keeps the dividend's sign, as ``math.fmod`` does). The same expression is checked
against the real Prometheus in ``tests/e2e/test_promql_e2e.py``."""

from __future__ import annotations

import math
import random

import pytest

from gpu_efficiency.engine.quarantine import thermal as faults_thermal
from gpu_efficiency.sources.metrics.prometheus.promql import THERMAL_BITS, thermal_bits_expr


def promql_thermal_bits(value: float) -> bool:
    """``clamp_max(value % 128, 31) % 16 >= 8`` as Prometheus evaluates it."""
    z = math.fmod(value, 128) if math.isfinite(value) else math.nan
    clamped = min(z, 31.0) if not math.isnan(z) else math.nan
    return math.fmod(clamped, 16) >= 8 if not math.isnan(clamped) else False


def per_bit_terms(value: float) -> bool:
    """The three terms the single comparison replaced: ``value % 2^(b+1) >= 2^b`` per bit."""
    if not math.isfinite(value):
        return False
    return any(math.fmod(value, 2 ** (b + 1)) >= 2**b for b in THERMAL_BITS)


def test_the_bits_are_the_engines() -> None:
    assert sum(1 << b for b in THERMAL_BITS) == faults_thermal.THERMAL_BITS


def test_the_expression_names_one_selection() -> None:
    expr = thermal_bits_expr("last_over_time(x[120s])")
    assert expr.count("last_over_time(x[120s])") == 1


@pytest.mark.parametrize("start", range(0, 1 << 18, 1 << 14))
def test_matches_any_thermal_bit_on_every_integer(start: int) -> None:
    for value in range(start, start + (1 << 14)):
        expected = bool(value & faults_thermal.THERMAL_BITS)
        assert promql_thermal_bits(float(value)) is expected, value
        assert per_bit_terms(float(value)) is expected, value


def test_agrees_with_the_per_bit_terms_on_odd_values() -> None:
    rng = random.Random(7)
    values = [-1.0, -8.0, -104.0, -0.5, 0.5, 7.999, 8.0, 31.5, 32.0, 1e15 + 8, 2.0**53]
    values += [math.nan, math.inf, -math.inf]
    values += [rng.uniform(-1e6, 1e6) for _ in range(20_000)]
    for value in values:
        assert promql_thermal_bits(value) is per_bit_terms(value), value
