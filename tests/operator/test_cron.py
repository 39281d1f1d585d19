"""The cron parser and its ticks (durablerun_operator.cron), pure: fields, names, steps, both day fields, the
ticks before and after a moment in a time zone across daylight-saving changes, and the API server's pattern
(durablerun.schedules.CRON_PATTERN) agreeing with the parser on what is an expression."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from durablerun import schedules
from durablerun_operator import cron

NEW_YORK = cron.zone("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(expression: str, after: datetime, count: int, tz: object = UTC) -> list[datetime]:
    parsed, out = cron.parse(expression), []
    for _ in range(count):
        found = cron.next_tick(parsed, tz, after)  # type: ignore[arg-type]
        assert found is not None
        out.append(found)
        after = found
    return out


@pytest.mark.parametrize(("expression", "field", "values"), [
    ("*/15 * * * *", "minutes", {0, 15, 30, 45}),
    ("5/20 * * * *", "minutes", {5, 25, 45}),
    ("1-10/3,59 * * * *", "minutes", {1, 4, 7, 10, 59}),
    ("0 9-17 * * *", "hours", {9, 10, 11, 12, 13, 14, 15, 16, 17}),
    ("0 0 * JAN,mar-May *", "months", {1, 3, 4, 5}),
    ("0 0 * * MON-FRI", "weekdays", {1, 2, 3, 4, 5}),
    ("0 0 * * 7", "weekdays", {0}),
    ("@hourly", "minutes", {0}),
    ("@weekly", "weekdays", {0}),
])
def test_fields_read_as_cron_reads_them(expression: str, field: str, values: set[int]) -> None:
    assert getattr(cron.parse(expression), field) == values


@pytest.mark.parametrize("expression", [
    "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 13 *", "* * * * 8",
    "*/0 * * * *", "5-3 * * * *", "a * * * *", "* * * FOO *", "@every 5m", "",
])
def test_bad_expressions_are_refused_naming_the_field(expression: str) -> None:
    with pytest.raises(cron.CronError):
        cron.parse(expression)


@pytest.mark.parametrize("expression", [
    "* * * * *", "*/15 9-17 * * MON-FRI", "0 0 1 1 *", "@daily", "@YEARLY", " 0  6 * * sun ", "1,2,3-5/2 0 1 jan 0",
])
def test_the_api_servers_pattern_lets_through_what_the_parser_reads(expression: str) -> None:
    assert re.match(schedules.CRON_PATTERN, expression)
    cron.parse(expression)


@pytest.mark.parametrize("expression", [
    "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 13 *", "* * * * 8",
    "*/0 * * * *", "a * * * *", "* * * FOO *", "@every 5m", "", "*\t* * * *",
])
def test_the_api_servers_pattern_refuses_what_the_parser_refuses(expression: str) -> None:
    assert not re.match(schedules.CRON_PATTERN, expression)


def test_every_minute_ticks_at_each_minute_strictly_after() -> None:
    assert ticks("* * * * *", utc(2026, 6, 1, 10, 0, 0), 3) == [
        utc(2026, 6, 1, 10, 1), utc(2026, 6, 1, 10, 2), utc(2026, 6, 1, 10, 3)]
    assert ticks("* * * * *", utc(2026, 6, 1, 10, 0, 30), 1) == [utc(2026, 6, 1, 10, 1)]


def test_both_day_fields_restricted_match_either_as_cron() -> None:
    # The 13th, or any Friday: June 2026 has Fridays on 5, 12, 19, 26.
    days = [t.day for t in ticks("0 0 13 * FRI", utc(2026, 6, 1), 4)]
    assert days == [5, 12, 13, 19]
    # A day field starting with * restricts nothing for that rule: the 13th only when it is a Friday.
    assert ticks("0 0 13 * */1", utc(2026, 6, 1), 1) == [utc(2026, 6, 13)]
    # The 1st, 8th, 15th, 22nd or 29th that is a Friday: none until January 2027.
    assert ticks("0 0 */7 * FRI", utc(2026, 6, 1), 2) == [utc(2027, 1, 1), utc(2027, 1, 8)]


def test_feb_29_is_found_years_ahead_and_never_is_never() -> None:
    assert ticks("0 0 29 2 *", utc(2026, 3, 1), 1) == [utc(2028, 2, 29)]
    assert cron.next_tick(cron.parse("0 0 30 2 *"), UTC, utc(2026, 1, 1)) is None
    assert cron.last_tick(cron.parse("0 0 30 2 *"), UTC, utc(2026, 1, 1)) is None


def test_the_last_tick_is_at_or_before_the_moment() -> None:
    every_5 = cron.parse("*/5 * * * *")
    assert cron.last_tick(every_5, UTC, utc(2026, 6, 1, 10, 7, 30)) == utc(2026, 6, 1, 10, 5)
    assert cron.last_tick(every_5, UTC, utc(2026, 6, 1, 10, 5)) == utc(2026, 6, 1, 10, 5)
    yearly = cron.parse("@yearly")
    assert cron.last_tick(yearly, UTC, utc(2026, 6, 1)) == utc(2026, 1, 1)


def test_a_time_zone_moves_the_ticks() -> None:
    assert ticks("0 9 * * *", utc(2026, 6, 1), 1, NEW_YORK) == [utc(2026, 6, 1, 13)]  # EDT, UTC-4
    assert ticks("0 9 * * *", utc(2026, 1, 1), 1, NEW_YORK) == [utc(2026, 1, 1, 14)]  # EST, UTC-5


def test_a_wall_time_skipped_by_spring_forward_does_not_happen() -> None:
    # 2026-03-08 in New York: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist that day.
    found = ticks("30 2 * * *", utc(2026, 3, 7, 12), 2, NEW_YORK)
    assert [t.astimezone(NEW_YORK).day for t in found] == [9, 10]
    # Ticks on either side of the gap are an hour of real time apart, as the wall clock says.
    hourly = ticks("0 * * * *", utc(2026, 3, 8, 6, 30), 2, NEW_YORK)  # 01:30 EST
    assert hourly == [utc(2026, 3, 8, 7), utc(2026, 3, 8, 8)]  # 03:00 EDT is 07:00 UTC: 02:00 never was
    assert [t.astimezone(NEW_YORK).hour for t in hourly] == [3, 4]


def test_a_wall_time_repeated_by_fall_back_happens_twice_as_cronjob() -> None:
    # 2026-11-01 in New York: 02:00 EDT falls back to 01:00 EST, so 01:30 happens at 05:30 and 06:30 UTC.
    assert ticks("30 1 * * *", utc(2026, 10, 31, 12), 3, NEW_YORK) == [
        utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30), utc(2026, 11, 2, 6, 30)]
    parsed = cron.parse("30 1 * * *")
    assert cron.last_tick(parsed, NEW_YORK, utc(2026, 11, 1, 6, 0)) == utc(2026, 11, 1, 5, 30)
    assert cron.last_tick(parsed, NEW_YORK, utc(2026, 11, 1, 7, 0)) == utc(2026, 11, 1, 6, 30)
    # Every 20 minutes through the repeated hour: in real-time order, no tick lost or doubled.
    found = ticks("*/20 * * * *", utc(2026, 11, 1, 5, 30), 6, NEW_YORK)
    assert found == [utc(2026, 11, 1, 5, 40) + timedelta(minutes=20 * i) for i in range(6)]


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(cron.CronError, match="Mars/Olympus"):
        cron.zone("Mars/Olympus")
