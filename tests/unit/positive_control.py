"""Positive controls for "never" properties: a property such as "broken data never evicts" also
passes when nothing ever evicts, so each one is paired with a search of its own generator for an
example where the rules do act (an eviction, a taint, a reclaim). The search is derandomized and
does not shrink: the same examples every run, and the first that acts will do."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hypothesis import Phase, find, settings
from hypothesis import strategies as st

T = TypeVar("T")


def reached(strategy: st.SearchStrategy[T], condition: Callable[[T], bool], *, tries: int = 500) -> T:
    """The first example of ``strategy`` that meets ``condition``; fails (``NoSuchExample``) when
    ``tries`` examples hold none: the property paired with it would then be vacuous."""
    return find(
        strategy,
        condition,
        settings=settings(
            max_examples=tries, phases=[Phase.generate], database=None, deadline=None, derandomize=True
        ),
    )
