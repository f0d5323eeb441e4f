"""How often the fault candidates query checks every GPU's PCIe link, and what the last check named.

The fault filter's PCIe link terms (``promql.pcie_filter``) select the four link series and the GPU
utilisation of every GPU. At 8,000 GPUs they are ~40 % of the candidates query's Prometheus work,
and that query ends a steady cycle last (bench/scale/RESULTS.md). A link changes rarely. The PCIe
rule (``engine/quarantine/pcie.py``) already needs it down over the whole fault lookback, and the
link terms name a GPU on that same condition. So the link terms run at most every LINK_CHECK_S, or
every fault lookback when that is shorter, per source, matchers and fault window. In the cycles
between, the fault candidates are the GPUs this cycle's other terms name plus the FAULT candidates
the last check named. Those GPUs' fault windows are fetched every cycle, as before, so a named link
that recovers or gets worse is judged at once.

What this changes: a link that down-trains between two checks is named (and judged) up to
LINK_CHECK_S (or one lookback) later than with a check every cycle. A node the operator holds keeps
every GPU a candidate each cycle (``promql._held_nodes``), whatever this says. A check whose answer
never came (the fetch failed) is not recorded, so the next cycle checks again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

#: Most seconds between two full link checks of one source (matchers and fault window): at the
#: default 30 s interval two cycles of three skip them. A shorter lookback checks every lookback,
#: so the added delay never exceeds the time the rule needs the link down anyway.
LINK_CHECK_S = 90.0

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class _Check:
    at: float
    named: frozenset[Key]


class LinkCheck:
    """The last full link check per (matchers, fault window seconds); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[tuple[str, float], _Check] = {}

    def due(self, now: float, matchers: str, seconds: float) -> bool:
        """Must this fetch check every GPU's link? Yes the first time, LINK_CHECK_S (or the
        lookback ``seconds``, when shorter) after the last check, and when the clock went back."""
        with self._lock:
            last = self._checks.get((matchers, seconds))
        return last is None or not 0 <= now - last.at < min(LINK_CHECK_S, seconds)

    def record(self, now: float, matchers: str, seconds: float, named: Iterable[Key]) -> None:
        """A check's answer: the GPUs it named for the fault window (whichever term named them)."""
        with self._lock:
            self._checks[(matchers, seconds)] = _Check(now, frozenset(named))

    def carried(self, matchers: str, seconds: float) -> frozenset[Key]:
        """The fault candidates the last check named (none before a check)."""
        with self._lock:
            last = self._checks.get((matchers, seconds))
        return last.named if last is not None else frozenset()
