"""durable-run's Prometheus alerts. Each has severity, summary, description, for and a runbook link.

Expressions aggregate per-run series ``by (namespace, name)`` (see
``config.RUN``). Metric names and their meaning: docs/metrics.md; what to do
when an alert fires: docs/runbooks.md (one section per alert).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from durablerun import api
from monitoring import config

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str  # static, one of SEVERITIES: routing reads it, so it never depends on the alert's labels
    summary: str
    description: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity {self.severity!r} is not one of {SEVERITIES}: when it "
                             "depends on a label, split the alert")

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": textwrap.dedent(self.expr).strip() + "\n",
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": " ".join(self.description.split()),
                "runbook_url": runbook_url(self.name),
            },
        }


def runbook_url(alert: str) -> str:
    """The alert's section of docs/runbooks.md (GitHub anchors: the heading, lowercased)."""
    return f"{config.RUNBOOK_BASE_URL}#{alert.lower()}"


RUN = config.RUN
RUN_LABELS = "{{ $labels.namespace }}/{{ $labels.name }}"


def _max(metric: str) -> str:
    return f"max by ({RUN}) ({metric})"


USER_REQUESTED = api.AbortReason.USER_REQUESTED.value


def _aborted(reasons: str) -> str:
    # The abort_reason series exists while the run is Aborted; max_over_time
    # bridges scrape gaps and keeps a run deleted right after its abort visible.
    return f"""
        max by ({RUN}, reason) (
          max_over_time(durablerun_run_abort_reason{{{reasons}}}[{config.ABORT_ALERT_MEMORY}])
        ) == 1
    """


ABORTED = Alert(
    name="DurableRunAborted",
    expr=_aborted(f'reason!="{USER_REQUESTED}"'),
    for_="0m",  # an abort stands until a user acts: there is nothing to debounce
    severity="critical",
    summary="A durable run was aborted.",
    description=f"""
        DurableRun {RUN_LABELS} was aborted: {{{{ $labels.reason }}}}.
        It will not run again until the limit that stopped it is raised or it is retried
        (the {api.ANNOTATION_RETRY} annotation).
    """,
)

# A deliberate abort (kubectl durablerun abort) is news, not a page: its own alert, so severity stays static.
ABORTED_BY_USER = Alert(
    name="DurableRunAbortedByUser",
    expr=_aborted(f'reason="{USER_REQUESTED}"'),
    for_="0m",
    severity="info",
    summary="A durable run was aborted by request.",
    description=f"""
        DurableRun {RUN_LABELS} was aborted by request (the {api.ANNOTATION_ABORT} annotation).
        It will not run again unless its user retries it.
    """,
)

FAILED = Alert(
    name="DurableRunFailed",
    # last_over_time, not max_over_time: a retried run (phase series back to 0) resolves at once, while a
    # run deleted right after failing (its series gone) keeps alerting for the same memory as an abort.
    expr=f"""
        max by ({RUN}) (
          last_over_time(durablerun_run_phase{{phase="{api.Phase.FAILED.value}"}}[{config.ABORT_ALERT_MEMORY}])
        ) == 1
    """,
    for_="0m",  # a failure stands until a user acts: there is nothing to debounce
    severity="critical",
    summary="A durable run failed.",
    description=f"""
        DurableRun {RUN_LABELS} failed: its workflow raised, its input or configuration was refused, or its
        store could not be used (status.message says which). It will not run again until it is retried
        (the {api.ANNOTATION_RETRY} annotation) or re-created.
    """,
)

RESTART_LOOP = Alert(
    name="DurableRunRestartLoop",
    # Counters start at 0 for every reason when the operator first sees a run,
    # so increase() counts the first restart too. Restarts of every cause count:
    # a run evicted again and again is also not getting anywhere.
    expr=f"""
        sum by ({RUN}) (increase(durablerun_run_restarts_total[{config.RESTART_LOOP_WINDOW}]))
          >= {config.RESTART_LOOP_RESTARTS}
        unless on ({RUN})
          {_max(f'durablerun_run_phase{{phase=~"{config.FINISHED_PHASES}"}}')} == 1
    """,
    for_="1m",
    severity="warning",
    summary="A durable run keeps restarting.",
    description=f"""
        DurableRun {RUN_LABELS} was restarted {{{{ $value | printf "%.0f" }}}} times in the last
        {config.RESTART_LOOP_WINDOW}. Every restart replays the journal and retries the current step.
    """,
)

STUCK = Alert(
    name="DurableRunStuck",
    # The runner aborts an attempt that makes no progress for progressTimeout,
    # but each new attempt starts that clock again, and a Pending pod has no
    # runner at all: across attempts, no step for longer than the timeout.
    expr=f"""
        {_max("durablerun_run_seconds_since_progress")}
          > {_max("durablerun_run_progress_timeout_seconds")}
        and on ({RUN})
          {_max(f'durablerun_run_phase{{phase=~"{config.ACTIVE_PHASES}"}}')} == 1
    """,
    for_="5m",
    severity="warning",
    summary="A durable run makes no progress.",
    description=f"""
        DurableRun {RUN_LABELS} has completed no step for {{{{ $value | humanizeDuration }}}},
        longer than its policy.progressTimeout, while Pending, Running or in Backoff.
    """,
)


def _budget(used: str, ceiling: str, budget: str) -> str:
    return f'label_replace({_max(used)} / {_max(ceiling)}, "budget", "{budget}", "", "")'


BUDGET_NEAR_CEILING = Alert(
    name="DurableRunBudgetNearCeiling",
    expr=f"""
        (
          {_budget("durablerun_run_cost_usd", "durablerun_run_cost_ceiling_usd", "cost")}
          or
          {_budget("durablerun_run_tokens", "durablerun_run_token_limit", "tokens")}
          or
          {_budget("durablerun_run_completed_steps", "durablerun_run_step_limit", "steps")}
        ) >= {config.BUDGET_RATIO}
        and on ({RUN})
          {_max(f'durablerun_run_phase{{phase!~"{config.FINISHED_PHASES}"}}')} == 1
    """,
    for_="1m",
    severity="warning",
    summary="A durable run has nearly used up its budget.",
    description=f"""
        DurableRun {RUN_LABELS} has used {{{{ $value | humanizePercentage }}}} of its
        {{{{ $labels.budget }}}} ceiling; at 100% it is aborted (BudgetExhausted).
    """,
)

WAITING_ON_BUDGET = Alert(
    name="DurableRunWaitingOnBudget",
    expr=f"""
        max by ({RUN}, budget) (durablerun_run_waiting_on_budget) == 1
    """,
    for_="0m",
    severity="warning",
    summary="A durable run waits for a person to raise its budget.",
    description=f"""
        DurableRun {RUN_LABELS} stopped at its policy.askAt.{{{{ $labels.budget }}}} limit and waits, with no
        pod, until someone raises it (kubectl durablerun budget) or aborts the run.
    """,
)

LEASE_STALE = Alert(
    name="DurableRunLeaseStale",
    # Exported only while the run is Running, i.e. while a pod must renew it.
    expr=f"""
        {_max("durablerun_run_seconds_since_lease_renewal")}
          > {config.LEASE_STALE_FACTOR} * {_max("durablerun_run_lease_duration_seconds")}
    """,
    for_="1m",
    severity="warning",
    summary="A running durable run's lease expired and the run was not taken over.",
    description=f"""
        The runner of DurableRun {RUN_LABELS} last renewed its lease {{{{ $value | humanizeDuration }}}}
        ago, more than {config.LEASE_STALE_FACTOR}x its lease duration, and the operator has not
        started a new attempt.
    """,
)

OPERATOR_DOWN = Alert(
    name="DurableRunOperatorDown",
    # build_info is 1 on every successful scrape and marked stale by the first
    # failed one. Absent means the operator is down or nothing scrapes it, and
    # needs no assumption about the scrape job's name.
    expr="absent(durablerun_build_info)",
    for_="5m",
    severity="critical",
    summary="The durable-run operator is down or not scraped.",
    description="""
        Prometheus has no durablerun_build_info: the durable-run operator is not running, not ready,
        or not scraped. While it is down, crashed runs are not restarted and no policy is enforced
        by the operator.
    """,
)

MASS_LEASE_EXPIRY = Alert(
    name="DurableRunMassLeaseExpiry",
    # max over operators: during a rollout two may be scraped, and either one holding restarts is the news.
    expr="""
        max(durablerun_lease_restarts_held)
        and on ()
          max(durablerun_mass_lease_expiry) == 1
    """,
    for_="2m",  # a short stall (an API server restart) ends by itself; minutes of it need a look
    severity="warning",
    summary="Many durable runs' leases lapsed at once: their restarts are held.",
    description="""
        A large share of the running durable runs stopped renewing their leases together: the API server
        or the operator is too slow for the renewals, not the runners. The restarts of
        {{ $value | printf "%.0f" }} runs, which rest only on their leases, are held until renewals
        recover; a pod seen dead is still restarted at once.
    """,
)

QUOTA_SATURATED = Alert(
    name="DurableRunQuotaSaturated",
    # max over operators: during a rollout two may read the same windows.
    expr=f"""
        max by (quota) (durablerun_quota_tokens_used) / max by (quota) (durablerun_quota_tokens_limit)
          >= {config.QUOTA_SATURATED_RATIO}
        and on (quota)
          max by (quota) (durablerun_quota_runs_waiting) > 0
    """,
    for_="15m",  # a burst fills the window for a minute or two by design; a quarter of an hour is a size problem
    severity="warning",
    summary="A model quota stays full while runs wait for room.",
    description="""
        ModelQuota {{ $labels.quota }} has used {{ $value | humanizePercentage }} of its tokens per minute for
        15 minutes while runs wait, with no pod, for room in it: the fleet asks for more than the quota allows.
        Raise the quota (and the provider's limit behind it), or start fewer runs.
    """,
)

QUOTA_WINDOWS_DOWN = Alert(
    name="DurableRunQuotaWindowsDown",
    expr="""
        max by (quota) (durablerun_quota_windows_up) == 0
    """,
    for_="2m",
    severity="critical",
    summary="The Redis of the model quotas cannot be reached.",
    description="""
        The operator cannot read ModelQuota {{ $labels.quota }}'s windows from the shared Redis. Runners cannot
        either: their model calls wait (quotas.whenUnavailable: wait) or go unlimited (proceed) until it is back.
    """,
)

RUN_ALERTS = (ABORTED, ABORTED_BY_USER, FAILED, RESTART_LOOP, STUCK, BUDGET_NEAR_CEILING, WAITING_ON_BUDGET,
              LEASE_STALE)
OPERATOR_ALERTS = (OPERATOR_DOWN, MASS_LEASE_EXPIRY)
QUOTA_ALERTS = (QUOTA_SATURATED, QUOTA_WINDOWS_DOWN)
ALL = RUN_ALERTS + OPERATOR_ALERTS + QUOTA_ALERTS


def groups() -> dict[str, Any]:
    """The Prometheus rule file: ``{"groups": [...]}``."""
    return {
        "groups": [
            {"name": "durablerun.runs", "rules": [alert.rule() for alert in RUN_ALERTS]},
            {"name": "durablerun.operator", "rules": [alert.rule() for alert in OPERATOR_ALERTS]},
            {"name": "durablerun.quotas", "rules": [alert.rule() for alert in QUOTA_ALERTS]},
        ]
    }
