"""The self-service page's HTML (pure): the verdict and diagnosis in plain words, the evidence
drawn, the deadline as a countdown, what will happen and how to get it back, and the two buttons.

No script, no external style or font (the server's Content-Security-Policy allows neither); every
value from the cluster is escaped. The buttons are POST forms carrying the token in a hidden field
(no cookies, so another site cannot click for the user); Keep for offers only the policy's choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape

from gpu_efficiency.api import names
from gpu_efficiency.api.durations import format_duration
from gpu_efficiency.api.timefmt import format_relative, format_rfc3339, parse_rfc3339
from gpu_efficiency.selfservice.chart import Series, countdown_bar, nice_top, panel
from gpu_efficiency.selfservice.tokens import PAGE_PATH, Claims

KEEP_PATH = PAGE_PATH + "/keep"
RELEASE_PATH = PAGE_PATH + "/release"
#: The GET page reloads itself this often, so the countdown and the chart stay current without script.
REFRESH_S = 60

#: What a reclaim does to each owner kind, in the words of its user (engine/reclaim/owners.py acts).
WHAT_HAPPENS: Mapping[str, str] = {
    "ReplicaSet": "its Deployment is scaled to zero replicas (the pod is deleted; the Deployment stays)",
    "Deployment": "the Deployment is scaled to zero replicas (the pod is deleted; the Deployment stays)",
    "StatefulSet": "the StatefulSet is scaled to zero replicas (volumes are kept)",
    "Job": "the Job is suspended (its pods are deleted; the Job and its progress record stay)",
    "Notebook": "the notebook is stopped (its volume is kept; start it again from the dashboard)",
    "": "the pod is evicted (nothing recreates it)",
}
STYLE = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:720px;color:#111;line-height:1.4}
h1{font-size:22px;margin:0 0 4px} .sub{color:#555;margin:0 0 16px}
.box{border:1px solid #ddd;border-radius:8px;padding:12px 16px;margin:12px 0}
.verdict{font-size:18px;font-weight:600} .count{font-size:28px;font-weight:700;color:#dc2626}
button{font-size:15px;padding:8px 14px;margin:4px 6px 4px 0;border-radius:6px;border:1px solid #888;cursor:pointer}
.keep{background:#ecfdf5;border-color:#059669} .release{background:#fef2f2;border-color:#dc2626}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px} .err{color:#b91c1c} .ok{color:#047857}
"""


@dataclass(frozen=True, slots=True)
class PageFacts:
    """Everything the page shows, read by the server (service.py)."""

    claims: Claims
    token: str
    now: float
    annotations: Mapping[str, str]
    owner_kind: str  # of the pod's controller ("" for a bare pod)
    owner_name: str
    keep_choices: tuple[str, ...]  # rules.keep_choices: empty where the policy allows no keep
    max_keep_s: float
    activity_below: float
    window_s: float
    step_s: float
    series: Mapping[str, Series] = field(default_factory=dict)  # activity and utilization, 0-1
    memory: Series = ()  # GiB
    evidence_error: str = ""


def _doc(title: str, body: str, *, refresh: bool = False) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="referrer" content="no-referrer">{meta}<title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def error_page(title: str, message: str) -> str:
    """A plain refusal: what is wrong, that nothing changed, and who to ask."""
    return _doc(
        title,
        f"<h1>{escape(title)}</h1><p class=err>{escape(message)}.</p>"
        "<p>Nothing was changed. If your GPU was warned, the warning (the pod's events, "
        "<code>kubectl describe pod</code>, or the message you received) has a current link; "
        "otherwise ask your cluster admin.</p>",
    )


def result_page(ok: bool, message: str, back: str) -> str:
    """The answer to a click, with the way back to the page (no refresh: a click is never resent)."""
    css = "ok" if ok else "err"
    return _doc(
        "GPU self-service",
        f"<h1>{'Done' if ok else 'Not done'}</h1><p class={css}>{escape(message)}.</p>"
        f'<p><a href="{escape(back)}">Back to the page</a></p>',
    )


def what_happens(owner_kind: str, owner_name: str) -> str:
    text = WHAT_HAPPENS.get(owner_kind)
    if text is None:
        return f"its {owner_kind} {owner_name} is reclaimed (suspended or scaled to zero; its record stays)"
    return text


def restore_line(claims: Claims, owner_kind: str, owner_name: str) -> str:
    if owner_kind in ("", "ReplicaSet"):
        if owner_kind == "":
            return "An evicted bare pod is not recreated: submit it again."
        owner_kind, owner_name = "Deployment", owner_name.rsplit("-", 1)[0]
    return f"gpu-efficiency restore {owner_kind.lower()}/{owner_name} -n {claims.namespace}"


def _verdict(ann: Mapping[str, str], facts: PageFacts) -> str:
    numbers = []
    if names.SM_ACTIVE in ann:
        signal = ann.get(names.ACTIVITY_SIGNAL, "SM activity")
        numbers.append(f"peak activity {escape(ann[names.SM_ACTIVE])} ({escape(signal)})")
    if names.GPU_UTIL in ann:
        numbers.append(f"GPU utilization {escape(ann[names.GPU_UTIL])}")
    state = ann.get(names.STATE, "")
    if state in ("Idle", "Warned"):
        headline = f"This GPU has done no real work for the last {format_duration(facts.window_s)}."
    else:
        headline = f"The operator now reads this GPU as {escape(state or 'not judged')}."
    parts = [
        f"<p class=verdict>{headline}</p>",
        f"<p>The operator counts a GPU as idle when its activity stays below <b>{facts.activity_below:g}</b> "
        "over the whole window"
        + (f". Measured: {'; '.join(numbers)}" if numbers else "")
        + ". Memory held does not make a GPU busy.</p>",
    ]
    if names.DIAGNOSIS in ann:
        advice = f" — {escape(ann[names.RECOMMENDATION])}" if names.RECOMMENDATION in ann else ""
        parts.append(f"<p>Diagnosis: <b>{escape(ann[names.DIAGNOSIS])}</b>{advice}</p>")
    return "".join(parts)


def _deadline(ann: Mapping[str, str], facts: PageFacts) -> str:
    deadline = parse_rfc3339(ann.get(names.EVICT_AFTER))
    if names.RELEASE in ann:
        return "<p class=count>Released</p><p>You gave this GPU back: it is reclaimed at the operator's next cycle.</p>"
    if deadline is None:
        held = ann.get(names.KEEP_FOR) or ann.get(names.KEEP_UNTIL)
        if held:
            return f"<p class=count>Kept</p><p>Kept with <code>{escape(held)}</code> (at most {format_duration(facts.max_keep_s)} from when first seen).</p>"
        return "<p>No reclaim is scheduled for this pod now.</p>"
    left = deadline - facts.now
    return (
        f"<p>Reclaimed in</p><p class=count>{escape(format_duration(max(left, 0)))}</p>"
        f"<p>at {escape(format_rfc3339(deadline))} ({escape(format_relative(deadline, facts.now))}) unless the GPU "
        "becomes active or you keep it.</p>"
        + countdown_bar(facts.now, parse_rfc3339(ann.get(names.IDLE_SINCE)), deadline)
    )


def _buttons(facts: PageFacts) -> str:
    token = escape(facts.token)
    keep = ""
    if facts.keep_choices:
        choices = "".join(
            f'<button class=keep type=submit name=duration value="{escape(c)}">Keep for {escape(c)}</button>'
            for c in facts.keep_choices
        )
        keep = (
            f'<form method=post action="{KEEP_PATH}"><input type=hidden name=t value="{token}">{choices}</form>'
            f"<p class=sub>Keep for counts from when the operator sees it, at most "
            f"{format_duration(facts.max_keep_s)} (the policy's maxKeep).</p>"
        )
    else:
        keep = "<p class=sub>This policy does not allow keeping an idle GPU.</p>"
    release = (
        f'<form method=post action="{RELEASE_PATH}"><input type=hidden name=t value="{token}">'
        "<button class=release type=submit>Release now</button></form>"
        "<p class=sub>Release now gives the GPU back at the operator's next cycle.</p>"
    )
    return keep + release


def page(facts: PageFacts) -> str:
    """The whole page for one warned pod."""
    c, ann = facts.claims, facts.annotations
    start, end = facts.now - facts.window_s, facts.now
    if facts.evidence_error:
        charts = f"<p class=err>The evidence could not be read now: {escape(facts.evidence_error)}.</p>"
    else:
        charts = panel(
            "GPU activity",
            facts.series,
            start=start,
            end=end,
            top=1.0,
            step_s=facts.step_s,
            threshold=facts.activity_below,
        )
        top = max((v for _, v in facts.memory), default=0.0)
        charts += panel(
            "Memory used",
            {"Memory used (GiB)": facts.memory},
            start=start,
            end=end,
            top=nice_top(top * 1.1),
            step_s=facts.step_s,
        )
    body = (
        f"<h1>Your GPU is about to be reclaimed</h1>"
        f"<p class=sub>pod <b>{escape(c.namespace)}/{escape(c.pod)}</b> · policy {escape(c.policy)}</p>"
        f"<div class=box>{_verdict(ann, facts)}</div>"
        f"<div class=box><b>Evidence over the last {format_duration(facts.window_s)}</b>{charts}</div>"
        f"<div class=box>{_deadline(ann, facts)}"
        f"<p>What will happen: {escape(what_happens(facts.owner_kind, facts.owner_name))}.</p>"
        f"<p>To get it back afterwards: <code>{escape(restore_line(c, facts.owner_kind, facts.owner_name))}</code></p></div>"
        f"<div class=box>{_buttons(facts)}</div>"
    )
    return _doc(f"GPU of {c.namespace}/{c.pod}", body, refresh=True)
