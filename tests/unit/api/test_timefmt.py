from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpu_efficiency.api.timefmt import format_rfc3339, parse_rfc3339


def test_format_is_utc_seconds_with_z() -> None:
    assert format_rfc3339(1_700_000_000.9) == "2023-11-14T22:13:20Z"


@pytest.mark.parametrize(
    "value",
    [
        datetime(2023, 11, 14, 22, 13, 20, 900_000),  # naive: UTC, as the Kubernetes client may return
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
        datetime(2023, 11, 14, 23, 13, 20, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_format_takes_datetimes_as_utc(value: datetime) -> None:
    assert format_rfc3339(value) == "2023-11-14T22:13:20Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20z", 1_700_000_000.0),
        ("2023-11-14T22:13:20.5Z", 1_700_000_000.5),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),  # no offset: UTC
        (" 2023-11-14T22:13:20Z ", 1_700_000_000.0),
    ],
)
def test_parse_accepts_rfc3339_forms(text: str, expected: float) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize("text", [None, "", "tomorrow", "2023-13-40T00:00:00Z", "1700000000"])
def test_parse_returns_none_for_garbage(text: str | None) -> None:
    assert parse_rfc3339(text) is None


def test_round_trip() -> None:
    assert parse_rfc3339(format_rfc3339(1_234_567_890.0)) == 1_234_567_890.0
