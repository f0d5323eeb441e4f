"""How active a GPU is, from which signal, and whether there is enough data to say.

Safety rule 1: absence of data is never idleness. A GPU gets an activity only from a signal whose
samples are numerous, fresh and in range; otherwise it is Unknown and nothing destructive follows.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_efficiency.engine.model import GPUSample, Signal, Stats, Window
from gpu_efficiency.engine.params import CycleParams

#: Upper bound of an unbounded signal (bytes/s, MiB, W): only NaN/inf/negative are rejected.
UNBOUNDED = sys.float_info.max
#: Tolerance for fractions a sampler reports as 1.0000001.
_EPS = 1e-6

#: The activity fallback chain (SM active, GR engine active, GPU util): (signal, largest valid value, scale to a 0-1 fraction).
ACTIVITY_CHAIN: tuple[tuple[Signal, float, float], ...] = (
    (Signal.SM_ACTIVE, 1.0 + _EPS, 1.0),
    (Signal.GR_ENGINE_ACTIVE, 1.0 + _EPS, 1.0),
    (Signal.GPU_UTIL, 100.0 + _EPS, 0.01),
)


#: The most streaming multiprocessors of any NVIDIA GPU (GB202: 192). While a kernel runs, at least
#: one warp is resident on at least one SM, so a GPU whose kernels ran a share ``u`` of the window
#: (GPU_UTIL) has an SM (and GR engine) activity of at least ``u / MAX_SMS_PER_GPU``: below that the
#: readings contradict each other and one of them is wrong (or forged).
MAX_SMS_PER_GPU = 192
#: GPU_UTIL (as a fraction) from which a contradiction is judged. GPU_UTIL and the profiling fields
#: are sampled by different counters at different periods; averaged over a whole window they may
#: differ by a scrape period's worth, never by kernels having run for half the window.
CONTRADICTION_UTIL = 0.5


@dataclass(frozen=True, slots=True)
class DataBounds:
    """How many samples are enough and how old the newest may be, for one GPU and window."""

    needed: float  # expected samples x minCoverage
    oldest: float  # unix seconds: a newest sample before this is stale


def data_bounds(sample: GPUSample, params: CycleParams, now: float) -> DataBounds:
    """Expected samples come from the source (window / scrape interval) or, failing that, the policy."""
    expected = sample.expected_samples.get(Window.ACTIVITY) or params.expected_activity_samples
    bounds = DataBounds(needed=expected * params.min_coverage, oldest=now - params.max_staleness_s)
    return carried_bounds(bounds, sample.carried_newest)


#: ``carried_bounds``' oldest for a fresh carried window: every finite time (and +inf) passes.
_ANY_FINITE = -sys.float_info.max


def carried_bounds(bounds: DataBounds, carried_newest: float | None) -> DataBounds:
    """The bounds for a window carried from an earlier fetch (``GPUSample.carried_newest``).

    Its Stats keep the times they were fetched with; each present (finite) one counts as the GPU's
    newest sample time now, as if the window had been fetched this cycle. So either every finite
    time passes (the newest is fresh) or none does (stale, or NaN: no newest time); NaN and -inf
    times fail as they would have. Judged once per GPU instead of rebuilding its Stats each cycle.
    """
    if carried_newest is None:
        return bounds
    fresh = carried_newest >= bounds.oldest  # False for NaN
    return DataBounds(needed=bounds.needed, oldest=_ANY_FINITE if fresh else math.inf)


def insufficiency(stats: Stats | None, upper: float, bounds: DataBounds) -> str:
    """Why these stats cannot be trusted ('' when they can): missing, sparse, stale or out of range."""
    if stats is None:
        return "no samples"
    count = stats.count
    if count <= 0 or count < bounds.needed:
        return f"{count} samples in the window, {bounds.needed:.0f} needed"
    if not stats.last_timestamp >= bounds.oldest:  # also rejects NaN
        return "stale: the newest sample is older than maxStaleness"
    avg, peak = stats.avg, stats.max
    if not (0.0 <= avg <= upper and 0.0 <= peak <= upper):  # rejects NaN, inf and negatives
        return f"values out of range (avg={avg}, max={peak})"
    return ""


def usable(stats: Stats | None, upper: float, bounds: DataBounds) -> Stats | None:
    """The stats when trustworthy, else None (a diagnosis needing them is simply not made)."""
    if stats is None or insufficiency(stats, upper, bounds):
        return None
    return stats


@dataclass(frozen=True, slots=True)
class GPUActivity:
    """Activity of one GPU over the activity window; ``signal`` is None when Unknown."""

    uuid: str
    signal: Signal | None
    peak: float  # 0-1, peak over the window (idleness); NaN when Unknown
    avg: float  # 0-1, average over the window (diagnosis); NaN when Unknown
    unknown_reason: str = ""

    @property
    def known(self) -> bool:
        return self.signal is not None


def gpu_activity(sample: GPUSample, bounds: DataBounds) -> GPUActivity:
    """The first signal of SM_ACTIVE -> GR_ENGINE_ACTIVE -> GPU_UTIL/100 with sufficient data.

    A signal that is present but unusable (sparse, stale, NaN) is skipped for the next one rather
    than trusted; only when none is usable is the GPU Unknown, with every signal's problem listed.
    """
    window = sample.stats.get(Window.ACTIVITY)
    if not window:
        return GPUActivity(sample.uuid, None, float("nan"), float("nan"), "no samples in the activity window")
    problems: list[str] = []
    for signal, upper, scale in ACTIVITY_CHAIN:
        stats = window.get(signal)
        if stats is None:
            continue
        why = insufficiency(stats, upper, bounds)
        if not why:
            conflict = contradiction(signal, stats, window, bounds)
            if conflict:
                return GPUActivity(sample.uuid, None, float("nan"), float("nan"), conflict)
            return GPUActivity(sample.uuid, signal, stats.max * scale, stats.avg * scale)
        problems.append(f"{signal.value}: {why}")
    reason = "; ".join(problems) if problems else "no activity signal (SM_ACTIVE, GR_ENGINE_ACTIVE, GPU_UTIL)"
    return GPUActivity(sample.uuid, None, float("nan"), float("nan"), reason)


CONTRADICTING = "contradicting signals"


def contradiction(signal: Signal, stats: Stats, window: Mapping[Signal, Stats], bounds: DataBounds) -> str:
    """Why ``signal``'s low reading cannot be believed ('' when it can): another usable signal of
    the same window says kernels ran (safety rule 8: one signal never overrides a contradicting one
    into a destructive verdict). SM and GR engine activity are checked against GPU_UTIL."""
    if signal is Signal.GPU_UTIL:
        return ""
    util = gpu_util_fraction(window, bounds)
    if util is None or util < CONTRADICTION_UTIL:
        return ""
    floor = util / MAX_SMS_PER_GPU
    if stats.avg >= floor:
        return ""
    return (
        f"{CONTRADICTING}: {signal.value} average {stats.avg:.4f} while "
        f"{Signal.GPU_UTIL.value} average {util * 100:.0f} % says kernels ran; running kernels keep "
        f"at least one SM of at most {MAX_SMS_PER_GPU} busy ({floor:.4f}), so one reading is wrong"
    )


def gpu_util_fraction(window: Mapping[Signal, Stats], bounds: DataBounds) -> float | None:
    """Average GPU_UTIL as a 0-1 fraction when trustworthy (the exporter serves percent)."""
    stats = usable(window.get(Signal.GPU_UTIL), ACTIVITY_CHAIN[2][1], bounds)
    return None if stats is None else stats.avg / 100.0


# ---- how far in time the evidence reaches (safety rule 12) -------------------------------------------


def newest_sample(sample: GPUSample, signal: Signal | None) -> float:
    """When ``signal`` of this GPU was last sampled, as its freshness is judged (NaN: no time).

    A window carried from an earlier fetch keeps that fetch's times in its Stats; its GPU's newest
    sample now is ``carried_newest`` (the same time ``carried_bounds`` judges freshness by)."""
    if sample.carried_newest is not None:
        return sample.carried_newest
    stats = None if signal is None else sample.get(Window.ACTIVITY, signal)
    return math.nan if stats is None else stats.last_timestamp


@dataclass(frozen=True, slots=True)
class EvidenceReach:
    """How far a pod's idle evidence reaches in time: the earliest of its GPUs' newest samples.

    ``until`` is NaN when a GPU (``gpu``) has no time, or one from the future (``future``): a time
    later than any honest answer read this cycle can carry is garbage, not evidence."""

    until: float
    gpu: str  # the GPU whose newest sample is the earliest (or has none, or is from the future)
    newest: float  # that GPU's newest sample time as the source gave it
    future: bool = False


def evidence_reach(
    samples: Sequence[GPUSample], activities: Sequence[GPUActivity], latest: float
) -> EvidenceReach:
    """The reach of the idle evidence of a pod on ``samples``, judged from ``activities``' signals.

    ``latest``: the latest sample time an answer read this cycle can honestly carry (the cycle's
    time is taken before the queries are sent, so a sample scraped meanwhile may follow it)."""
    signals = {a.uuid: a.signal for a in activities}
    reach = EvidenceReach(math.inf, "", math.inf)
    for sample in samples:
        newest = newest_sample(sample, signals.get(sample.uuid))
        if math.isnan(newest) or newest > latest:
            return EvidenceReach(math.nan, sample.uuid, newest, future=newest > latest)
        if newest < reach.until:
            reach = EvidenceReach(newest, sample.uuid, newest)
    return reach if reach.gpu else EvidenceReach(math.nan, "", math.nan)
