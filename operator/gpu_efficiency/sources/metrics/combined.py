"""Prometheus and the node agents together: one sample per GPU, from whichever is better.

Either source alone suffices: agents keep the operator informed when Prometheus is down, and
Prometheus covers nodes without an agent. Only when both fail is the cycle blind (Unknown).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.engine import merge_samples
from gpu_efficiency.sources.metrics.base import (
    DropTally,
    FetchRequest,
    FetchResult,
    SampleSource,
    SourceUnavailable,
    read_early,
)


@dataclass
class CombinedSource:
    prometheus: SampleSource
    agents: SampleSource
    max_staleness: float

    def read_early(self, request: FetchRequest) -> None:
        """Prometheus' early read (the agents are read in the fetch: they answer in milliseconds)."""
        read_early(self.prometheus, request)

    def fetch(self, request: FetchRequest) -> FetchResult:
        started = time.monotonic()
        prom, prom_error = _try(self.prometheus, request)
        agents, agents_error = _try(self.agents, request)
        if prom is None and agents is None:
            raise SourceUnavailable(f"Prometheus: {prom_error}; node agents: {agents_error}")
        errors = [f"Prometheus: {prom_error}"] * bool(prom_error) + [f"node agents: {agents_error}"] * bool(
            agents_error
        )
        answered = [r for r in (prom, agents) if r is not None]
        merged = DropTally()
        gpus = merge_samples(
            prom.gpus if prom else (),
            agents.gpus if agents else (),
            now=request.now,
            max_staleness=self.max_staleness,
            drops=merged,
        )
        return FetchResult(
            gpus=tuple(gpus),
            queries=sum(r.queries for r in answered),
            seconds=time.monotonic() - started,
            warnings=(*errors, *(w for r in answered for w in r.warnings)),
            then=prom.then if prom else None,
            dropped=_summed([*(r.dropped for r in answered), merged.counts()]),
        )


def _summed(tallies: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for tally in tallies:
        for reason, count in tally.items():
            out[reason] = out.get(reason, 0) + count
    return out


def _try(source: SampleSource, request: FetchRequest) -> tuple[FetchResult | None, str]:
    try:
        return source.fetch(request), ""
    except SourceUnavailable as exc:
        return None, str(exc)
