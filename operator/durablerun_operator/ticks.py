"""What a DurableRunSchedule does now: pure, a function of (the schedule, its runs, now) -> a :class:`TickPlan`.

Ticks are CronJob's (its controller's ``mostRecentScheduleTime``): the tick due is the most recent one after
the schedule's last (``status.lastScheduleTime``, else its creation) and at or before now; the ticks missed
before it, while the operator was down or the schedule suspended, are not made up: at most one catch-up run,
and with ``startingDeadlineSeconds`` only a tick at most that old. A tick whose run already exists (the name is
the tick's: ``schedules.run_name``) is done; that is what makes a tick fire once across operator restarts.
Under Forbid, a tick while a run of the schedule is not finished creates nothing (it may still start late,
within the starting deadline, once that run ends, as a CronJob's); under Replace the running ones are aborted
through ``durablerun.dev/abort`` (the runner undoes its work in its abort grace, as ``kubectl durablerun
abort``), and the new run is created at once. Finished runs past the history limits are deleted, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic

from durablerun import api, schedules
from durablerun_operator import cron

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class RunView:
    """A run a schedule created, as the schedule needs it."""

    name: str
    uid: str
    scheduled: datetime | None  # its tick (the scheduled-time annotation)
    created: datetime | None
    phase: api.Phase | None
    completed: datetime | None  # status.completionTime
    deleting: bool
    aborting: bool  # the abort annotation is set (by Replace, or a person)

    @property
    def finished(self) -> bool:
        return self.phase is not None and self.phase.finished

    @property
    def order(self) -> datetime:
        return self.scheduled or self.created or _EPOCH

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RunView:
        meta, status = body["metadata"], body.get("status") or {}
        phase = str(status.get("phase") or "")
        return cls(name=meta["name"], uid=meta.get("uid", ""),
                   scheduled=_time((meta.get("annotations") or {}).get(api.ANNOTATION_SCHEDULED_TIME)),
                   created=_time(meta.get("creationTimestamp")),
                   phase=api.Phase(phase) if phase in set(api.Phase) else None,
                   completed=_time(status.get("completionTime")),
                   deleting=bool(meta.get("deletionTimestamp")),
                   aborting=api.ANNOTATION_ABORT in (meta.get("annotations") or {}))


def _time(text: str | None) -> datetime | None:
    try:
        return api.parse_time(text)
    except ValueError:
        return None


@dataclass
class TickPlan:
    """What to do for a schedule now, in this order: abort, create, delete, write the status, post the Events."""

    #: The tick whose run to create (``schedules.run_name``), if any.
    create: datetime | None = None
    #: Runs to abort (Replace), and the reason their abort annotation gives.
    abort: list[str] = field(default_factory=list)
    abort_reason: str = ""
    #: Finished runs past the history limits: (name, uid).
    delete: list[tuple[str, str]] = field(default_factory=list)
    #: The whole status (every field: a merge patch with null removes what is stale), and whether it changed.
    status: dict[str, Any] = field(default_factory=dict)
    status_changed: bool = False
    #: (type, reason, message) of each Event on the schedule.
    events: list[tuple[str, str, str]] = field(default_factory=list)
    #: When to look again, besides the schedule's and its runs' watch events (None: only on those).
    wake: datetime | None = None


def decide(body: dict[str, Any], runs: list[RunView], now: datetime) -> TickPlan:
    """The plan for the schedule ``body`` (as read) and the runs it owns, at ``now``."""
    meta = body["metadata"]
    name = meta["name"]
    old = _status(body)
    plan = TickPlan()
    try:
        spec = schedules.DurableRunScheduleSpec.model_validate(body.get("spec") or {})
        expression = cron.parse(spec.schedule)
        zone = cron.zone(spec.timeZone)
    except (pydantic.ValidationError, cron.CronError) as error:
        message = f"the schedule cannot fire: {_first_line(error)}"
        plan.status = {**old.model_dump(mode="json"), "nextScheduleTime": None, "message": message}
        plan.status_changed = plan.status != old.model_dump(mode="json")
        if old.message != message:
            plan.events.append(("Warning", "InvalidSchedule", message))
        return plan

    status = old.model_copy(deep=True)
    status.message = None
    history(spec, runs, plan)
    succeeded = [r.completed for r in runs if r.phase == api.Phase.SUCCEEDED and r.completed]
    last_success = max([*succeeded, *filter(None, [_time(old.lastSuccessfulTime)])], default=None)
    status.lastSuccessfulTime = api.format_time(last_success) if last_success else None
    active = [r for r in runs if not r.finished and not r.deleting]
    by_name = {r.name: r for r in runs}
    ticks = [r.scheduled for r in runs if r.scheduled]
    last = max([*ticks, *filter(None, [_time(old.lastScheduleTime)])], default=None)

    nxt = None if spec.suspend else cron.next_tick(expression, zone, now)
    plan.wake = nxt
    due = None if spec.suspend else _due(spec, expression, zone, last or _time(meta.get("creationTimestamp")),
                                         now, status, plan)
    if due is not None:
        run = schedules.run_name(name, due)
        if run in by_name:
            last = max(last or due, due)  # created before the operator stopped: the tick is done
        elif spec.concurrencyPolicy == schedules.ConcurrencyPolicy.FORBID and active:
            if old.lastSkippedTime != api.format_time(due):
                plan.events.append(("Normal", "RunAlreadyActive", (
                    f"the tick of {api.format_time(due)} creates no run: concurrencyPolicy Forbid, and "
                    f"{', '.join(sorted(r.name for r in active))} has not finished")))
            status.lastSkippedTime = api.format_time(due)
        else:
            if spec.concurrencyPolicy == schedules.ConcurrencyPolicy.REPLACE:
                plan.abort = sorted(r.name for r in active if not r.aborting)
                plan.abort_reason = f"replaced by {run}, the run of schedule {name}'s tick {api.format_time(due)}"
                if plan.abort:
                    plan.events.append(("Normal", "Replacing", (
                        f"aborting {', '.join(plan.abort)}: concurrencyPolicy Replace, tick {api.format_time(due)}")))
            plan.create = due
            last = due
            active.append(RunView(run, "", due, None, None, None, False, False))
    status.lastScheduleTime = api.format_time(last) if last else None
    status.nextScheduleTime = api.format_time(nxt) if nxt else None
    status.active = [schedules.RunReference(name=r.name, uid=r.uid or None,
                                            scheduledTime=api.format_time(r.scheduled) if r.scheduled else None)
                     for r in sorted(active, key=lambda r: (r.order, r.name))]
    status.activeCount = len(status.active)
    plan.status = status.model_dump(mode="json")
    plan.status_changed = plan.status != old.model_dump(mode="json")
    return plan


def _due(spec: schedules.DurableRunScheduleSpec, expression: cron.Cron, zone: Any, earliest: datetime | None,
         now: datetime, status: schedules.DurableRunScheduleStatus, plan: TickPlan) -> datetime | None:
    """The tick due now (the most recent one after ``earliest``), or None; a tick missed past the starting
    deadline is told once (an Event, status.lastSkippedTime)."""
    tick = cron.last_tick(expression, zone, now)
    if tick is None or (earliest is not None and tick <= earliest):
        return None
    deadline = spec.startingDeadlineSeconds
    if deadline is not None and tick < now - timedelta(seconds=deadline):
        when = api.format_time(tick)
        if status.lastSkippedTime != when:
            plan.events.append(("Warning", "MissedSchedule", (
                f"the tick of {when} was missed by more than startingDeadlineSeconds={deadline} (the operator was "
                "down, or an earlier run held it under Forbid): no run for it")))
            status.lastSkippedTime = when
        return None
    return tick


def history(spec: schedules.DurableRunScheduleSpec, runs: list[RunView], plan: TickPlan) -> None:
    """Delete the oldest finished runs past successfulRunsHistoryLimit and failedRunsHistoryLimit."""
    for keep, phases in ((spec.successfulRunsHistoryLimit, {api.Phase.SUCCEEDED}),
                         (spec.failedRunsHistoryLimit, {api.Phase.FAILED, api.Phase.ABORTED})):
        done = sorted((r for r in runs if r.phase in phases and not r.deleting), key=lambda r: (r.order, r.name))
        plan.delete.extend((r.name, r.uid) for r in done[:max(len(done) - keep, 0)])


def _status(body: dict[str, Any]) -> schedules.DurableRunScheduleStatus:
    try:
        return schedules.DurableRunScheduleStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError:
        return schedules.DurableRunScheduleStatus()


def _first_line(error: Exception) -> str:
    if isinstance(error, pydantic.ValidationError):
        first = error.errors()[0]
        return f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(error)
