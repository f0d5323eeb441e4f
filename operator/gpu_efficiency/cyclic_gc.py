"""Pausing the cyclic garbage collector around work that makes ~10^5 short-lived acyclic objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building ~10^5 short-lived objects: it would rescan them all
    several times (measured 4x slower decoding at 8,000 GPUs). Nothing here forms cycles.

    Re-enabling it makes the next allocation collect the youngest generation: every object made
    meanwhile that is still alive. A cycle's objects should be dropped inside the pause (they are
    freed by reference counting); outer and inner pauses nest (only the outermost re-enables)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
