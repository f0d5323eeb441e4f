"""glibc malloc settings for the long-running operator: two arenas and a fixed mmap threshold.

Why: every cycle fetches from Prometheus on a pool of up to 16 fresh threads, and glibc gives
threads arenas of their own (up to 8 per core), each keeping the high water of whatever its
threads allocated; its dynamic mmap threshold also rises after the first ~1 MB response chunk is
freed, so later chunks land in those heaps instead of being unmapped. At 8,000 GPU pods the
operator's RSS then climbed ~5 MiB a cycle outside Python's own allocator (274 to 286 MiB over six
cycles, its live objects constant). Capped at two arenas with the threshold fixed at 128 KiB (the
same as ``MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072``), it stayed at 200-205 MiB, peak 219
(bench/scale/RESULTS.md).

Set in the process before its threads start (``mallopt`` does not move threads already attached to
an arena). A value the environment already gives glibc is left alone, and a libc without
``mallopt`` (musl, macOS) is not touched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENA_MAX = 2
MMAP_THRESHOLD = 128 * 1024
#: What ``tune`` applied in this process (for the operator's start-up log line).
APPLIED: dict[str, int] = {}

#: parameter, value, and the environment variable that overrides it.
SETTINGS = (
    (M_ARENA_MAX, ARENA_MAX, "MALLOC_ARENA_MAX"),
    (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
)


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def tune(
    environ: Mapping[str, str] = os.environ,
    mallopt: Callable[[int, int], int] | None = None,
) -> dict[str, int]:
    """Apply ``SETTINGS`` not already set in ``environ``; returns those glibc accepted, by variable."""
    call = mallopt if mallopt is not None else _glibc_mallopt()
    if call is None:
        return {}
    applied = {}
    for param, value, variable in SETTINGS:
        if variable in environ:
            continue
        if call(param, value) == 1:  # mallopt returns 1 on success
            applied[variable] = value
        else:
            log.debug("mallopt(%d, %d) refused", param, value)
    APPLIED.update(applied)
    return applied
