"""Steady workloads make no annotation writes (safety rule 6), even with the noise of short windows.

The simulator's steady profiles are sampled as Prometheus would (15 s scrapes, a 2-minute window,
a cycle every 30 s) and the window averages go through the engine's annotation rule, as the scale
bench does at 8,000 pods. A fake source for the engine: plain data, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_efficiency.api import names
from gpu_efficiency.engine.model import Diagnosis, PodVerdict, Signal, Verdict
from gpu_efficiency.engine.reclaim.annotations import annotation_patch, desired_annotations
from gpu_efficiency.engine.reclaim.underutilization import efficiency_percent
from gpu_efficiency_sim import profiles
from gpu_efficiency_sim.gpu_models import DEFAULT_MODEL
from gpu_efficiency_sim.noise import seed_for

SCRAPE_S, WINDOW_S, INTERVAL_S, CYCLES = 15, 120, 30, 12
#: The bench's steady profiles, with the diagnosis each keeps (its noisiest, no-tensor-cores, most).
STEADY = {
    "compute-bound": (Verdict.EFFICIENT, Diagnosis.COMPUTE_BOUND, 300),
    "no-tensor-cores": (Verdict.UNDERUTILIZED, Diagnosis.NO_TENSOR_CORES, 1500),
    "low-occupancy": (Verdict.UNDERUTILIZED, Diagnosis.LOW_OCCUPANCY, 300),
    "memory-bound": (Verdict.UNDERUTILIZED, Diagnosis.MEMORY_BOUND, 300),
    "fake-load": (Verdict.UNDERUTILIZED, Diagnosis.FAKE_LOAD, 300),
}


def window_averages(profile: str, seed: int, offset: int) -> Iterator[tuple[float, float]]:
    """(SM activity, GPU util as a fraction) averaged over each cycle's window, cycle after cycle."""
    samples: dict[int, tuple[float, float]] = {}
    for cycle in range(CYCLES):
        end = 600 + offset + cycle * INTERVAL_S
        scrapes = range(end - WINDOW_S + SCRAPE_S, end + 1, SCRAPE_S)
        for t in scrapes:
            if t not in samples:
                reading = profiles.sample(profile, float(t), seed, DEFAULT_MODEL)
                samples[t] = (reading[Signal.SM_ACTIVE], reading[Signal.GPU_UTIL] / 100.0)
        yield (
            sum(samples[t][0] for t in scrapes) / len(scrapes),
            sum(samples[t][1] for t in scrapes) / len(scrapes),
        )


def verdict(kind: Verdict, diagnosis: Diagnosis, sm: float, util: float) -> PodVerdict:
    return PodVerdict(
        namespace="ns",
        name="p",
        verdict=kind,
        diagnosis=diagnosis,
        recommendation="",
        activity_signal=Signal.SM_ACTIVE,
        activity_peak=sm,
        activity_avg=sm,
        gpu_util_avg=util,
        efficiency=efficiency_percent(sm, util),
        gpus=(),
        reason="",
    )


def rewrites(profile: str, gpus: int) -> list[dict[str, str | None]]:
    """Every patch after the first cycle's, for ``gpus`` GPUs of this steady profile."""
    kind, diagnosis, _ = STEADY[profile]
    patches = []
    for index in range(gpus):
        seed = seed_for(f"node-{index // 8}", index % 8)
        current: dict[str, str] = {}
        for cycle, (sm, util) in enumerate(window_averages(profile, seed, seed % SCRAPE_S)):
            desired = desired_annotations(verdict(kind, diagnosis, sm, util), kind.value, "policy", current)
            patch = annotation_patch(current, desired)
            if cycle:
                patches += [patch] if patch else []
            current.update({k: v for k, v in patch.items() if v is not None})
    return patches


@pytest.mark.parametrize("profile", sorted(STEADY))
def test_steady_profiles_never_rewrite_their_numbers(profile: str) -> None:
    assert rewrites(profile, STEADY[profile][2]) == []


def test_the_noise_is_there_to_be_ignored() -> None:
    """The windows do move: at the annotations' own precision most cycles of every GPU would patch,
    so the test above proves the tolerance, not a noiseless simulator."""
    spreads = []
    for index in range(20):
        averages = [sm for sm, _ in window_averages("no-tensor-cores", seed_for("node-0", index), index)]
        assert len({f"{sm:.3f}" for sm in averages}) >= CYCLES // 2
        spreads.append(max(averages) - min(averages))
    assert max(spreads) > 0.03


def test_a_real_change_is_still_written() -> None:
    kind, diagnosis = Verdict.UNDERUTILIZED, Diagnosis.NO_TENSOR_CORES
    current = {
        k: v
        for k, v in desired_annotations(verdict(kind, diagnosis, 0.52, 1.0), kind.value, "p", {}).items()
        if v
    }
    patch = annotation_patch(
        current, desired_annotations(verdict(kind, diagnosis, 0.63, 1.0), kind.value, "p", current)
    )
    assert patch == {names.SM_ACTIVE: "0.630", names.EFFICIENCY: "0.630"}
