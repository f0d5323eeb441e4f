"""The contract every metric source meets, and an in-memory fake for tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpu_efficiency.engine.model import GPUSample, Window


class SourceUnavailable(Exception):  # noqa: N818 - reads as a state, like TimeoutError
    """The source could not answer at all (down, auth refused, timeout): the cycle acts on nothing."""


@dataclass(frozen=True, slots=True)
class FaultHints:
    """Lets a source skip fault series of healthy GPUs (most of them) without losing a fault.

    A GPU's fault windows are fetched when any of its fault signals is non-zero, it runs hot or shows a
    thermal clock-event bit, or its node is one the operator already holds faulted (recovery needs
    its data). Sources that cannot filter ignore the hints and return everything.
    """

    gpu_temperature_above: float | None = None
    memory_temperature_above: float | None = None
    held_nodes: frozenset[str] = frozenset()
    #: Durations (s) over which XID events are counted where DCGM_EXP_XID_ERRORS_COUNT is served:
    #: the fault lookback, each repeat rule's ``within``, the flood window (sources/metrics/prometheus/xid_counts.py).
    xid_windows: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ActivityHints:
    """Lets a source that caches activity windows (``--prometheus-refresh-budget``) know which GPUs
    could be judged idle: those whose peak activity is below ``idle_below`` (the policy's
    ``idle.activityBelow``, a 0-1 fraction) on some activity-chain signal. Such GPUs are always
    fetched fresh; only GPUs that can only be judged busy may be served from the cache.
    Sources without a cache ignore the hints."""

    idle_below: float


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """What one cycle needs: the windows (seconds) to aggregate over, and how dense samples should be."""

    now: float
    windows: Mapping[Window, float]
    scrape_interval: float
    hints: FaultHints | None = None
    activity: ActivityHints | None = None
    #: Address -> node of the cluster (``sources/metrics/targets.address_book``): a GPU's identity and its
    #: fault windows are believed only from a scrape target on its node. None: no check (callers
    #: that have no cluster, such as tests of other concerns; every cycle passes one).
    targets: Mapping[str, str] | None = None


class DropTally:
    """Series (or GPUs) a source dropped during one fetch, by reason; thread-safe, since a fetch
    decodes its answers on a pool. Reasons are short kebab-case words (metric label values)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, reason: str, count: int = 1) -> None:
        if count > 0:
            with self._lock:
                self._counts[reason] = self._counts.get(reason, 0) + count

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass(frozen=True, slots=True)
class FetchResult:
    gpus: tuple[GPUSample, ...]
    queries: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    refreshed: int | None = None  # GPUs whose activity window was fetched fresh (None: all, untiered)
    carried: int = 0  # GPUs whose activity window came from the source's cache
    #: The source's deferred work (the refresh budget's background fetch for later cycles, an old
    #: exporter inventory read again), for the cycle to start once it has made its writes, so that it
    #: does not compete with them for the CPU. Returns how many GPUs it started refreshing (rule 4;
    #: without a refresh budget, 1 when it started an inventory read). One-shot commands never start it.
    then: Callable[[], int] | None = None
    #: Series or GPUs dropped as untrustworthy, by reason (``DropTally``): shown in policy status.
    dropped: Mapping[str, int] = field(default_factory=dict)


class SampleSource(Protocol):
    """Anything that yields per-GPU samples for a cycle. Raises SourceUnavailable when it cannot."""

    def fetch(self, request: FetchRequest) -> FetchResult: ...


@runtime_checkable
class EarlyReads(Protocol):
    """A source that can start, before the cluster is read, what its next fetch reads whatever the
    cluster holds (the Prometheus source: every GPU's whole activity window when its cache is
    empty, ``sources/metrics/prometheus/tiered/early_window.py``). ``request`` has no hints or
    targets (they come from the nodes); the fetch at the same ``now`` takes what it started."""

    def read_early(self, request: FetchRequest) -> None: ...


def read_early(source: SampleSource, request: FetchRequest) -> None:
    """``source.read_early(request)`` where the source can (wrappers pass it on); else nothing."""
    if isinstance(source, EarlyReads):
        source.read_early(request)


@dataclass
class StaticSource:
    """A fake source returning fixed samples (or failing) — for unit tests of callers."""

    gpus: Sequence[GPUSample] = ()
    error: str | None = None
    calls: int = 0

    def fetch(self, request: FetchRequest) -> FetchResult:
        self.calls += 1
        if self.error is not None:
            raise SourceUnavailable(self.error)
        return FetchResult(gpus=tuple(self.gpus))
