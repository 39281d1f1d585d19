"""Cron expressions: parsed, and the ticks before and after a moment, in a time zone. Pure: no clock, no IO.

The syntax is the one ``durablerun.schedules.CRON_PATTERN`` lets through the API server: five fields (minute,
hour, day of month, month, day of week), each ``*`` or a comma list of values and ranges, each with an optional
step (``*/15``, ``1-30/2``, ``5/10`` = ``5-59/10``), month and day names in any case, day of week 0-7 (0 and 7
are Sunday), or a macro (``@hourly`` ...). As in cron, when both day fields are restricted, a day matching
either matches; a field that starts with ``*`` is unrestricted for that rule.

A tick is an instant whose wall-clock reading in the zone matches, as CronJob's (robfig/cron) ticks are: a
wall time a daylight-saving change skips never happens, and one it repeats happens twice (once per offset).
The search runs on wall-clock minutes (naive datetimes), jumping by month, day and hour, and maps each match
to the instants it names.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from durablerun import schedules

#: How far a search goes (wall-clock years) before it says an expression never matches (``0 0 30 2 *``).
_HORIZON_YEARS = 9
#: More than any time zone's offset ever moved at once: candidates this far apart in wall time are in order.
_SHIFT = timedelta(hours=3)
_MINUTE = timedelta(minutes=1)
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")


class CronError(ValueError):
    """The expression or the time zone cannot be read; the message names the field."""


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    day_star: bool
    weekday_star: bool

    def day_matches(self, moment: datetime) -> bool:
        in_month = moment.day in self.days
        in_week = (moment.isoweekday() % 7) in self.weekdays
        if self.day_star or self.weekday_star:
            return in_month and in_week
        return in_month or in_week

    def next_wall(self, wall: datetime) -> datetime | None:
        """The first matching wall-clock minute at or after ``wall`` (naive), None past the horizon."""
        w = wall.replace(second=0, microsecond=0) + (_MINUTE if wall.second or wall.microsecond else timedelta(0))
        limit = w.year + _HORIZON_YEARS
        while w.year <= limit:
            if w.month not in self.months:
                w = datetime(w.year + w.month // 12, w.month % 12 + 1, 1)
            elif not self.day_matches(w):
                w = datetime(w.year, w.month, w.day) + timedelta(days=1)
            elif w.hour not in self.hours:
                w = w.replace(minute=0) + timedelta(hours=1)
            elif w.minute not in self.minutes:
                w += _MINUTE
            else:
                return w
        return None

    def prev_wall(self, wall: datetime) -> datetime | None:
        """The last matching wall-clock minute at or before ``wall`` (naive), None past the horizon."""
        w = wall.replace(second=0, microsecond=0)
        limit = w.year - _HORIZON_YEARS
        while w.year >= limit:
            if w.month not in self.months:
                w = datetime(w.year, w.month, 1) - _MINUTE
            elif not self.day_matches(w):
                w = datetime(w.year, w.month, w.day) - _MINUTE
            elif w.hour not in self.hours:
                w = w.replace(minute=0) - _MINUTE
            elif w.minute not in self.minutes:
                w -= _MINUTE
            else:
                return w
        return None


def parse(expression: str) -> Cron:
    """``expression`` as a :class:`Cron`; CronError naming the field and what it may hold."""
    text = expression.strip()
    text = schedules.MACROS.get(text.lower(), text)
    fields = text.split()
    if len(fields) != 5:
        raise CronError(f"{expression!r}: a cron expression has 5 fields (minute hour day-of-month month "
                        f"day-of-week), not {len(fields)}")
    sets = [_field(f, i) for i, f in enumerate(fields)]
    weekdays = frozenset(d % 7 for d in sets[4])
    return Cron(frozenset(sets[0]), frozenset(sets[1]), frozenset(sets[2]), frozenset(sets[3]), weekdays,
                day_star=fields[2].startswith("*"), weekday_star=fields[4].startswith("*"))


def _field(text: str, index: int) -> set[int]:
    low, high = _RANGES[index]
    out: set[int] = set()
    for item in text.split(","):
        span, _, step_text = item.partition("/")
        step = _number(step_text, index, item) if step_text else 1
        if step < 1:
            raise CronError(f"{_FIELD_NAMES[index]} {item!r}: a step is at least 1")
        if span == "*":
            start, end = low, high
        elif "-" in span:
            first, _, last = span.partition("-")
            start, end = _value(first, index, item), _value(last, index, item)
            if start > end:
                raise CronError(f"{_FIELD_NAMES[index]} {item!r}: a range runs from low to high")
        else:
            start = _value(span, index, item)
            end = high if step_text else start  # 5/10: from 5 to the end, every 10
        out.update(range(start, end + 1, step))
    return out


def _value(text: str, index: int, item: str) -> int:
    names = {3: schedules.MONTH_NAMES, 4: schedules.DAY_NAMES}.get(index, ())
    upper = text.upper()
    if upper in names:
        return names.index(upper) + (1 if index == 3 else 0)
    value = _number(text, index, item)
    low, high = _RANGES[index]
    if not low <= value <= high:
        raise CronError(f"{_FIELD_NAMES[index]} {item!r}: {value} is outside {low}-{high}")
    return value


def _number(text: str, index: int, item: str) -> int:
    if not text.isdigit():
        raise CronError(f"{_FIELD_NAMES[index]} {item!r}: {text!r} is not a number")
    return int(text)


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name``; CronError if this process's time zone database lacks it."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as error:
        raise CronError(f"time zone {name!r} is not in this operator's time zone database: {error}") from None


def _instants(wall: datetime, tz: tzinfo) -> list[datetime]:
    """The instants (UTC) whose reading in ``tz`` is ``wall``: none in a gap, two in an overlap."""
    out: list[datetime] = []
    for fold in (0, 1):
        local = wall.replace(tzinfo=tz, fold=fold)
        instant = local.astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == wall and instant not in out:
            out.append(instant)
    return sorted(out)


def _steady(tz: tzinfo, instant: datetime) -> bool:
    """Whether ``tz``'s offset is the same a shift before and after ``instant``: then wall-clock order is the
    instants' order around it, and the first match found is the answer."""
    return (instant - _SHIFT).astimezone(tz).utcoffset() == (instant + _SHIFT).astimezone(tz).utcoffset()


def next_tick(cron: Cron, tz: tzinfo, after: datetime) -> datetime | None:
    """The first tick strictly after the instant ``after`` (UTC), None if the expression never matches."""
    wall = after.astimezone(tz).replace(tzinfo=None) - (timedelta(0) if _steady(tz, after) else _SHIFT)
    best: datetime | None = None
    while True:
        found = cron.next_wall(wall)
        if found is None:
            return best
        if best is not None and found > best.astimezone(tz).replace(tzinfo=None) + _SHIFT:
            return best
        for instant in _instants(found, tz):
            if instant > after and (best is None or instant < best):
                best = instant
        if best is not None and _steady(tz, best):
            return best
        wall = found + _MINUTE


def last_tick(cron: Cron, tz: tzinfo, at: datetime) -> datetime | None:
    """The last tick at or before the instant ``at`` (UTC), None if there is none within the horizon."""
    wall = at.astimezone(tz).replace(tzinfo=None) + (timedelta(0) if _steady(tz, at) else _SHIFT)
    best: datetime | None = None
    while True:
        found = cron.prev_wall(wall)
        if found is None:
            return best
        if best is not None and found < best.astimezone(tz).replace(tzinfo=None) - _SHIFT:
            return best
        for instant in _instants(found, tz):
            if instant <= at and (best is None or instant > best):
                best = instant
        if best is not None and _steady(tz, best):
            return best
        wall = found - _MINUTE
