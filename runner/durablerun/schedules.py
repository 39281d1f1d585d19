"""The DurableRunSchedule custom resource: DurableRuns created on a clock, as a CronJob creates Jobs.

A schedule names a cron expression and a time zone, the DurableRun it creates at each tick (``runTemplate``:
labels, annotations and a DurableRun's spec), what a tick does while an earlier run is still going
(``concurrencyPolicy``), how late a missed tick may still start (``startingDeadlineSeconds``) and how many
finished runs it keeps. Each run is named after its tick (:func:`run_name`), so a tick creates at most one run
however often the operator looks at it, and is owned by the schedule. A scheduled run is an ordinary
DurableRun: Kueue, quotas and budgets apply to it unchanged.

This module is the one definition of a schedule's fields and of the checks the API server makes at apply time
(the cron expression's syntax: :data:`CRON_RULE`; the time zone: the CRD adds the zone list, which
``hack/generate.py`` reads from the IANA database). The operator's cron parser
(``durablerun_operator.cron``) reads the same syntax. It imports only ``durablerun.api`` and
``durablerun.resource``.
"""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import Field

from durablerun.api import LABEL_SCHEDULE, _Model
from durablerun.resource import DurableRunSpec

# --- the cron expression: five fields (or a macro), each a list of values, ranges and steps ---------------------

#: The macros a schedule may be, as CronJob's, and the five fields each stands for.
MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")

# One value of each field, as a regular expression that holds its range (RE2 and Python alike).
_VALUES = (
    "[0-5]?[0-9]",  # minute 0-59
    "[01]?[0-9]|2[0-3]",  # hour 0-23
    "0?[1-9]|[12][0-9]|3[01]",  # day of month 1-31
    "0?[1-9]|1[0-2]|" + "|".join(MONTH_NAMES),  # month 1-12
    "[0-7]|" + "|".join(DAY_NAMES),  # day of week 0-7 (0 and 7: Sunday)
)


def _field(value: str) -> str:
    item = f"([*]|({value})(-({value}))?)(/[1-9][0-9]?)?"
    return f"{item}(,{item})*"


#: A cron expression, whole: five fields separated by spaces (``*``, lists, ranges, steps, month and day names
#: in any case), or a macro. Written without backslashes, so that it reads the same in a CEL string.
CRON_PATTERN = ("(?i)^ *(" + "|".join(MACROS) + "|" + " +".join(_field(v) for v in _VALUES) + ") *$")
CRON_RULE = f"self.matches('{CRON_PATTERN}')"
CRON_INVALID = ("not a cron expression: give five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12 "
                "or JAN-DEC, day of week 0-7 or SUN-SAT; each *, a value, a range a-b, a list a,b, with an "
                "optional step /n), e.g. '*/15 9-17 * * MON-FRI', or one of " + ", ".join(MACROS))
#: The time zone rule's message (the rule itself, the zone list, is the CRD's: durablerun_operator.crd).
TIME_ZONE_INVALID = "not a time zone of the IANA database: give one such as UTC, Europe/Paris or America/New_York"

#: A schedule's name is at most this long: its runs are ``<name>-<unix minutes>`` (9 more characters), and a
#: run's name labels its pods (at most 63). CronJob's limit, for the same reason, is 52.
NAME_MAX = 52
NAME_RULE = f"size(self.metadata.name) <= {NAME_MAX}"
NAME_TOO_LONG = (f"metadata.name: a schedule's name is at most {NAME_MAX} characters (its runs are "
                 "named <schedule>-<unix minutes>, and a run's name labels its pods)")


class ConcurrencyPolicy(enum.StrEnum):
    """What a tick does while a run the schedule created earlier has not finished (CronJob's three)."""

    ALLOW = "Allow"  # create the new run beside it
    FORBID = "Forbid"  # skip the tick (it may still start within startingDeadlineSeconds once the earlier ends)
    REPLACE = "Replace"  # abort the earlier run (durablerun.dev/abort), then create the new one


class RunTemplateMeta(_Model):
    """What the schedule's runs carry beside the schedule's own label and owner reference."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels for each run (e.g. kueue.x-k8s.io/queue-name: a scheduled run queues as any run).")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations for each run.")


class RunTemplate(_Model):
    """The DurableRun the schedule creates at each tick."""

    metadata: RunTemplateMeta = Field(default_factory=RunTemplateMeta, description=RunTemplateMeta.__doc__)
    spec: DurableRunSpec = Field(description="The spec of each run: a DurableRun's spec (kubectl explain dr.spec).")


class DurableRunScheduleSpec(_Model):
    """When to create a DurableRun, which one, and what a tick does while an earlier one still runs."""

    schedule: str = Field(
        min_length=1, max_length=256,
        description="A cron expression: minute hour day-of-month month day-of-week (e.g. '0 6 * * MON-FRI'), or "
                    "@hourly, @daily, @weekly, @monthly, @yearly. When both day fields are restricted, a day "
                    "matching either one matches (as cron).",
        json_schema_extra={"x-kubernetes-validations": [{"rule": CRON_RULE, "message": CRON_INVALID}]})
    timeZone: str = Field(
        default="UTC", min_length=1, max_length=64,
        description="The IANA time zone the expression is read in (e.g. Europe/Paris). A wall-clock time a "
                    "daylight-saving change skips does not happen; one it repeats happens twice (as CronJob).")
    runTemplate: RunTemplate = Field(description=RunTemplate.__doc__)
    concurrencyPolicy: ConcurrencyPolicy = Field(
        default=ConcurrencyPolicy.ALLOW,
        description="While a run this schedule created has not finished: Allow creates the next one beside it; "
                    "Forbid skips the tick; Replace aborts the running one and creates the next.")
    startingDeadlineSeconds: int | None = Field(
        default=None, ge=0,
        description="How late a tick may still create its run (the operator was down, or Forbid held it); a "
                    "tick missed by more is skipped. Unset: the most recent missed tick always starts.")
    successfulRunsHistoryLimit: int = Field(
        default=3, ge=0, le=1000, description="Succeeded runs to keep; older ones are deleted.")
    failedRunsHistoryLimit: int = Field(
        default=1, ge=0, le=1000, description="Failed or Aborted runs to keep; older ones are deleted.")
    suspend: bool = Field(
        default=False,
        description="true: no tick creates a run until false (runs already created go on). A tick missed "
                    "meanwhile starts on resuming only within startingDeadlineSeconds, or, unset, the most "
                    "recent one: set a deadline to resume without a catch-up run.")


class RunReference(_Model):
    """A run the schedule created."""

    name: str = Field(description="The DurableRun's name.")
    uid: str | None = Field(default=None, description="Its uid.")
    scheduledTime: str | None = Field(default=None, description="The tick it was created for.")


class DurableRunScheduleStatus(_Model):
    """What the schedule did last, as the operator wrote it."""

    active: list[RunReference] = Field(
        default_factory=list, description="Runs the schedule created that have not finished.",
        json_schema_extra={"maxItems": 1000})
    activeCount: int = Field(default=0, description="How many runs are active (kubectl get's Active column).")
    lastScheduleTime: str | None = Field(default=None, description="The last tick that created a run.")
    nextScheduleTime: str | None = Field(default=None, description="The next tick (none while suspended).")
    lastSuccessfulTime: str | None = Field(default=None, description="When a run of it last Succeeded.")
    lastSkippedTime: str | None = Field(
        default=None, description="The last tick that created no run (Forbid, or missed past the deadline).")
    message: str | None = Field(default=None, description="Why the schedule cannot fire, if it cannot.")


def run_name(schedule: str, tick: datetime) -> str:
    """The run a tick creates: ``<schedule>-<unix minutes>``. Deterministic, so that a tick looked at twice (an
    operator restarted across it, two operators) creates one run: the second create is refused (409)."""
    return f"{schedule}-{int(tick.timestamp()) // 60}"


def run_selector(schedule: str) -> str:
    """The label selector of a schedule's runs."""
    return f"{LABEL_SCHEDULE}={schedule}"
