"""The evidence as inline SVG (pure): no script, no external file, readable without JavaScript.

Two panels over the policy's window: activity (SM activity, GPU utilization: 0-1) with the idle
threshold as a dashed line, and framebuffer memory used (GiB). A gap in the data stays a gap
(absence of data is not idleness, so it is never drawn as zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

Series = Sequence[tuple[float, float]]  # (unix seconds, value)

WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 640, 190, 48, 12, 14, 26
COLOURS = {"SM activity": "#1f6feb", "GPU utilization": "#d97706", "Memory used (GiB)": "#7c3aed"}


def _x(t: float, start: float, end: float) -> float:
    return PAD_L + (t - start) / max(end - start, 1e-9) * (WIDTH - PAD_L - PAD_R)


def _y(v: float, top: float) -> float:
    v = min(max(v, 0.0), top)
    return HEIGHT - PAD_B - v / top * (HEIGHT - PAD_T - PAD_B)


def _paths(points: Series, start: float, end: float, top: float, gap_s: float) -> str:
    """An SVG path, broken where samples are further apart than ``gap_s``."""
    parts: list[str] = []
    last: float | None = None
    for t, v in points:
        command = "M" if last is None or t - last > gap_s else "L"
        parts.append(f"{command}{_x(t, start, end):.1f},{_y(v, top):.1f}")
        last = t
    return " ".join(parts)


def _time_label(t: float, start: float, end: float) -> str:
    """How long before now, in the unit that suits the window ("-15s", "-10m", "-2h")."""
    ago = end - t
    if ago < 0.5:
        return "now"
    if end - start <= 300:
        return f"-{round(ago)}s"
    if end - start <= 3 * 3600:
        return f"-{round(ago / 60)}m"
    return f"-{ago / 3600:.1f}h".replace(".0h", "h")


def nice_top(peak: float) -> float:
    """An axis top just above ``peak``: 1, 2, 4, 5 or 8 times a power of ten (at least 1)."""
    if peak <= 1:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(peak))
    return next(m * magnitude for m in (1, 2, 4, 5, 8, 10) if m * magnitude >= peak)


def panel(
    title: str,
    series: Mapping[str, Series],
    *,
    start: float,
    end: float,
    top: float,
    step_s: float,
    threshold: float | None = None,
    unit: str = "",
) -> str:
    """One chart: axes, ticks, a line per series, the threshold and a legend."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" aria-label="{escape(title)}">',
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{WIDTH - PAD_L - PAD_R}" height="{HEIGHT - PAD_T - PAD_B}" '
        'fill="#fafafa" stroke="#ccc"/>',
    ]
    for i in range(5):
        v = top * i / 4
        y = _y(v, top)
        label = f"{v:.2f}".rstrip("0").rstrip(".") + unit
        out.append(f'<line x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{label}</text>')
    for i in range(5):
        t = start + (end - start) * i / 4
        out.append(
            f'<text x="{_x(t, start, end):.1f}" y="{HEIGHT - 8}" font-size="11" text-anchor="middle">'
            f"{_time_label(t, start, end)}</text>"
        )
    if threshold is not None:
        y = _y(threshold, top)
        out.append(
            f'<line x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#dc2626" '
            'stroke-dasharray="6 4" stroke-width="1.5"><title>idle threshold</title></line>'
        )
        out.append(
            f'<text x="{WIDTH - PAD_R - 4}" y="{y - 4:.1f}" font-size="11" text-anchor="end" fill="#dc2626">'
            f"idle below {threshold:g}</text>"
        )
    legend_x = PAD_L + 6
    for name, points in series.items():
        colour = COLOURS.get(name, "#111")
        if points:
            path = _paths(points, start, end, top, gap_s=max(3 * step_s, 1.0))
            out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        shown = escape(name) + ("" if points else " (no data)")
        out.append(f'<text x="{legend_x}" y="{PAD_T + 14}" font-size="12" fill="{colour}">■ {shown}</text>')
        legend_x += 8 + 7 * len(shown)
    out.append("</svg>")
    return "".join(out)


def countdown_bar(now: float, idle_since: float | None, deadline: float) -> str:
    """A bar that empties as the deadline nears (how much of the warning is left)."""
    start = idle_since if idle_since is not None and idle_since < now else now - 1
    left = max(0.0, min(1.0, (deadline - now) / max(deadline - start, 1.0)))
    width = 400
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="14" role="img" aria-label="time left">'
        f'<rect width="{width}" height="14" rx="7" fill="#eee"/>'
        f'<rect width="{width * left:.0f}" height="14" rx="7" fill="#dc2626"/></svg>'
    )
