"""A partial answer is refused at its first bytes, not after reading it: at 1,000 nodes the scale
bench's VictoriaMetrics cluster sent a 59.7 MB partial activity answer (one vmstorage of two busy),
and reading it whole to find ``isPartial`` took the operator from ~210 MiB to a 710 MiB peak."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_efficiency.sources.metrics.base import SourceUnavailable
from gpu_efficiency.sources.metrics.prometheus.vector import PARTIAL, iter_vector

HEAD = b'{"status":"success","isPartial":true,"data":{"resultType":"vector","result":['
SERIES = b'{"metric":{"UUID":"GPU-a","gpueff_term":"t0"},"value":[1795796740,"0.5"]},'


def test_a_partial_answer_is_refused_before_its_body_is_read() -> None:
    read: list[int] = []

    def stream() -> Iterator[bytes]:
        yield HEAD
        for _ in range(200_000):  # ~15 MB of series, if anyone reads them
            read.append(len(SERIES))
            yield SERIES

    with pytest.raises(SourceUnavailable, match="partial") as caught:
        list(iter_vector(stream()))
    assert str(caught.value) == PARTIAL
    assert sum(read) < 1 << 16  # refused from its head, not from its whole body


def test_a_partial_answer_cut_anywhere_in_its_head_is_still_refused() -> None:
    body = HEAD + SERIES[:-1] + b"]}}"
    for cut in range(1, len(HEAD) + 1):
        with pytest.raises(SourceUnavailable, match="partial"):
            list(iter_vector([body[:cut], body[cut:]]))
