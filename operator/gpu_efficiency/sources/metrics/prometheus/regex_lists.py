"""Label values as literals inside a PromQL regex, and lists of them cut to fit a query.

Every listed query (fault windows of named candidates, the tiered refresh's activity windows and
chains, held nodes) puts untrusted label values (UUIDs, node names, UUID endings) inside a RE2 regex
inside a PromQL double-quoted string; ``regex_literal`` makes any text a literal there. The lists are
cut into patterns that fit ``promql.MAX_QUERY_BYTES`` however many times a query repeats them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Characters that stand for themselves both in a RE2 regex and in a PromQL double-quoted string.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
#: ASCII punctuation RE2 takes escaped with a backslash (not '"', which would end the PromQL string,
#: nor the backslash, which PromQL would read as an escape again: both go as hex).
_PUNCTUATION = frozenset("!#$%&'()*+,./:;<=>?@[]^`{|}~")


def _regex_char(char: str) -> str:
    if char in _PLAIN:
        return char
    if char in _PUNCTUATION:
        return "\\\\" + char
    return f"\\\\x{{{ord(char):x}}}"


def regex_literal(text: str) -> str:
    """``text`` as a literal inside a RE2 regex inside a PromQL double-quoted string.

    ASCII punctuation is escaped with a backslash, everything else (quote, space, control and
    non-ASCII characters) as RE2's ``\\x{hex}``; each backslash is doubled for the PromQL string.
    Valid for any text, where a bare backslash before a letter or a non-ASCII character makes an
    escape RE2 or PromQL rejects (``\\c``, ``\\é``) and a raw newline ends the string."""
    return "".join([_regex_char(char) for char in text])


def uuid_alternatives(uuids: Iterable[str]) -> list[str]:
    """These UUIDs as regex pieces for ``listed_window_queries`` (sorted, each once)."""
    return [regex_literal(u) for u in sorted(set(uuids))]


def ending_alternatives(endings: Iterable[str]) -> tuple[list[str], tuple[str, str]]:
    """The pieces and wrapper selecting every UUID ending in one of ``endings``: ``.*(a|b)``, a few
    bytes per ending whatever the number of GPUs behind it (the refresh budget's buckets)."""
    return [regex_literal(e) for e in sorted(set(endings))], (".*(", ")")


def chunk_alternatives(
    alternatives: Sequence[str], around: tuple[str, str], selectors: int, room: int
) -> list[str] | None:
    """``alternatives`` joined into patterns (``around`` each) that ``selectors`` copies of fit in
    ``room`` bytes, greedily in order; None when one alternative alone does not fit."""
    fixed = len(around[0].encode()) + len(around[1].encode())
    patterns: list[str] = []
    chunk: list[str] = []
    size = fixed
    for piece in alternatives:
        grown = size + len(piece.encode()) + (1 if chunk else 0)
        if chunk and grown * selectors > room:
            patterns.append(around[0] + "|".join(chunk) + around[1])
            chunk, grown = [], fixed + len(piece.encode())
        if grown * selectors > room:
            return None
        chunk.append(piece)
        size = grown
    if chunk:
        patterns.append(around[0] + "|".join(chunk) + around[1])
    return patterns
