"""The page says the verdict, draws the evidence with the threshold, counts down to the deadline,
offers only the policy's choices, and escapes every value from the cluster."""

from __future__ import annotations

from gpu_efficiency.api import names
from gpu_efficiency.selfservice.page import PageFacts, error_page, page
from gpu_efficiency.selfservice.tokens import Claims

NOW = 1_800_000_000.0


def facts(**overrides: object) -> PageFacts:
    base: dict[str, object] = {
        "claims": Claims("team-a", "nb-0", "uid-1", "default", int(NOW) + 1800),
        "token": "TOKEN.MAC",
        "now": NOW,
        "annotations": {
            names.STATE: "Warned",
            names.EVICT_AFTER: "2027-01-15T08:30:00Z",
            names.IDLE_SINCE: "2027-01-15T07:00:00Z",
            names.SM_ACTIVE: "0.001",
            names.GPU_UTIL: "0.000",
            names.DIAGNOSIS: "idle",
            names.RECOMMENDATION: "release the GPU",
        },
        "owner_kind": "Job",
        "owner_name": "train",
        "keep_choices": ("1h", "2h", "4h"),
        "max_keep_s": 4 * 3600.0,
        "activity_below": 0.01,
        "window_s": 1800.0,
        "step_s": 15.0,
        "series": {"SM activity": [(NOW - 600, 0.0), (NOW - 300, 0.002)], "GPU utilization": []},
        "memory": [(NOW - 600, 10.0)],
    }
    base.update(overrides)
    return PageFacts(**base)  # type: ignore[arg-type]


def test_the_page_says_why_when_what_and_how_back() -> None:
    html = page(facts())
    assert "done no real work for the last 30m" in html
    assert "below <b>0.01</b>" in html
    assert "Reclaimed in" in html
    assert "30m" in html
    assert "the Job is suspended" in html
    assert "gpu-efficiency restore job/train -n team-a" in html
    assert "<svg" in html
    assert "idle below 0.01" in html
    assert "stroke-dasharray" in html
    assert "GPU utilization (no data)" in html  # a missing series is said, never drawn as zero


def test_only_the_policy_choices_are_offered_as_posts_carrying_the_token() -> None:
    html = page(facts())
    for choice in ("1h", "2h", "4h"):
        assert f'value="{choice}">Keep for {choice}</button>' in html
    assert "Keep for 8h" not in html
    assert html.count('<input type=hidden name=t value="TOKEN.MAC">') == 2
    assert html.count("method=post") == 2
    assert "Release now" in html
    assert "<script" not in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_no_keep_where_the_policy_allows_none() -> None:
    html = page(facts(keep_choices=()))
    assert "Keep for" not in html.replace("Keep for counts", "")
    assert "does not allow keeping" in html


def test_cluster_values_are_escaped() -> None:
    evil = '<script>alert(1)</script>"'
    html = page(facts(annotations={names.DIAGNOSIS: evil, names.RECOMMENDATION: evil}, owner_name=evil))
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_a_released_or_kept_pod_says_so() -> None:
    assert "Released" in page(facts(annotations={names.RELEASE: "2027-01-15T08:00:00Z"}))
    assert "Kept" in page(facts(annotations={names.KEEP_FOR: "2h"}))


def test_the_error_page_says_nothing_changed() -> None:
    html = error_page("This link cannot be used", "this link has expired")
    assert "this link has expired" in html
    assert "Nothing was changed" in html
    assert "<form" not in html


def test_axes_read_in_the_window_unit_and_round_numbers() -> None:
    from gpu_efficiency.selfservice.chart import nice_top, panel

    short = panel("a", {"SM activity": [(NOW - 20, 0.0)]}, start=NOW - 30, end=NOW, top=1.0, step_s=1)
    assert ">-15s<" in short
    assert ">now<" in short
    long = panel("a", {"SM activity": []}, start=NOW - 7200, end=NOW, top=1.0, step_s=60)
    assert ">-60m<" in long
    assert [nice_top(p) for p in (0.5, 1.5, 66.4, 70.2, 81)] == [1.0, 2, 80, 80, 100]


def test_a_pod_no_longer_idle_is_not_called_idle() -> None:
    html = page(facts(annotations={names.STATE: "Efficient"}))
    assert "done no real work" not in html
    assert "reads this GPU as Efficient" in html
    assert "No reclaim is scheduled" in html
