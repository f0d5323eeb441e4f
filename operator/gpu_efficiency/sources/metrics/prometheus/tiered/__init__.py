"""The tiered fetch of the activity window, on only with ``--prometheus-refresh-budget`` > 0 (off by
default), kept apart so the default path (``prometheus/source.py``, ``windows.py``) reads alone:

- ``fetch``: ``TieredFetch``, the activity window refreshed only where it matters;
- ``activity_cache``: the cached windows it reuses between cycles and the rules for reusing them.
"""
