"""The whole activity window of every GPU, read before the cycle knows it needs it.

When the activity cache is empty (an operator's first cycle: a restart, a new leader), every GPU is
new, so the tiered fetch will read every GPU's whole window (``chain_samples.whole_sample_queries``)
whatever identity and the idle filter answer. That read was the restart's longest step (18.9 s of
35.3 s at 1,000 nodes x 8 GPUs), and it waited for the nodes, namespaces and pod addresses (the
informers' first LIST, 7.5 s) and then for identity (2.7 s), none of which it needs. So the cycle
starts it first (``TieredFetch.read_early``), the fetch that follows at the same evaluation time
takes its answers when its plan asks for exactly these queries, and drops it otherwise.

Nothing else changes: the queries, their evaluation time and the fold are the ones the fetch would
have sent itself, so the rows are the same; a failed read fails the fetch as the same query failing
there would. A read the fetch does not take stops sending (``cancel``) and is forgotten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_efficiency.cyclic_gc import gc_paused
from gpu_efficiency.sources.metrics.prometheus.promql import Query
from gpu_efficiency.sources.metrics.prometheus.tiered.chain_samples import WHOLE_IN_FLIGHT


class EarlyWindow:
    """The whole-window buckets at ``at``, read in a thread of their own, ``WHOLE_IN_FLIGHT`` at a
    time (the fetch's own limit: the operator holds two answers, not seventeen)."""

    def __init__(self, run: Callable[[Query, float], Any], at: float, queries: list[Query]) -> None:
        """``run``: one query at an evaluation time (``PrometheusSource.run``)."""
        self.at = at
        self.queries = queries
        self._run = run
        self._answers: list[tuple[Query, Any]] = []
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._read, name="prometheus-early-window", daemon=True)
        self._thread.start()

    def _one(self, query: Query) -> Any:
        return None if self._cancelled.is_set() else self._run(query, self.at)

    def _read(self) -> None:
        try:
            with (
                gc_paused(),
                ThreadPoolExecutor(WHOLE_IN_FLIGHT, thread_name_prefix="prometheus-early") as pool,
            ):
                for query, future in [(q, pool.submit(self._one, q)) for q in self.queries]:
                    answer = future.result()
                    if self._cancelled.is_set():
                        return
                    self._answers.append((query, answer))
        except Exception as exc:  # kept for the fetch, which raises it as its own query would
            self._error = exc
            self._cancelled.set()  # the buckets not yet asked for are not sent

    def cancel(self) -> None:
        """Send no more of its queries (the fetch did not take it); those in flight finish unread."""
        self._cancelled.set()

    def answers(self) -> list[tuple[Query, Any]]:
        """Every query's answer, once all are in; the first failure raised as the fetch's own."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if len(self._answers) != len(self.queries):  # cancelled: never taken by a fetch
            raise RuntimeError("an early window read that was cancelled has no answers")
        return self._answers
