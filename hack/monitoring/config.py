"""What the alerts and the dashboard share: one place to change a selector or a threshold."""

from __future__ import annotations

from durablerun import api

#: Every alert's runbook_url is this plus ``#<alertname lowercased>`` (a heading in docs/runbooks.md).
RUNBOOK_BASE_URL = "https://github.com/durable-run/durable-run/blob/main/docs/runbooks.md"

#: Phases regexes, from the API's one list of phases.
FINISHED_PHASES = "|".join(phase.value for phase in api.Phase if phase.finished)
#: Phases in which a run is expected to move forward on its own (Waiting and
#: Suspended runs wait for an event, a wake time or a user, by design).
ACTIVE_PHASES = "|".join((api.Phase.PENDING, api.Phase.RUNNING, api.Phase.BACKOFF))

#: DurableRunAborted keeps firing this long after the run's series vanish, so a
#: run deleted right after its abort (ttlSecondsAfterFinished) still pages, and
#: an operator restart (a scrape gap) does not resolve and re-fire the alert.
ABORT_ALERT_MEMORY = "10m"
#: DurableRunRestartLoop: this many restarts (any cause) within the window.
RESTART_LOOP_RESTARTS = 3
RESTART_LOOP_WINDOW = "30m"
#: DurableRunBudgetNearCeiling: share of a ceiling (cost, tokens, steps) used.
BUDGET_RATIO = 0.9
#: DurableRunQuotaSaturated: the share of a quota's tokens per minute in use, held for 15 minutes while runs wait.
QUOTA_SATURATED_RATIO = 0.95
#: DurableRunLeaseStale: lease age as a multiple of the lease duration. The
#: operator replaces a runner once its lease is 1x old; at 2x it has not.
LEASE_STALE_FACTOR = 2

#: Per-run series carry these labels; alerts aggregate to them so the scrape
#: target's labels (instance = the operator pod's IP) never change an alert's
#: identity: an operator restart must not resolve and re-page every alert.
RUN = "namespace, name"

DASHBOARD_UID = "durablerun-overview"
DASHBOARD_TITLE = "durable-run / Runs"
