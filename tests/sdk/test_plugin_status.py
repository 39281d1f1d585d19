"""What `kubectl durablerun status` says of a run (pure: the status as the API server returns it)."""

from __future__ import annotations

from datetime import UTC, datetime

from durablerun._private.tools.kubectl import describe_status

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def _run(status: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": "review-agent"}, "status": status}


def test_a_running_run_says_which_step_it_is_at_and_that_its_lease_is_held() -> None:
    lines = describe_status(_run({
        "phase": "Running", "message": "attempt 1 starting in pod review-agent-a1", "attempt": 1,
        "pod": "review-agent-a1",
        "progress": {"completedSteps": 4, "totalSteps": 8, "inFlight": {
            "name": "research-b", "position": "4", "attempt": 2, "startTime": "2026-11-28T11:59:30Z"}},
        "cost": {"usd": "0.42", "tokens": 1200},
        "lease": {"holder": "review-agent-a1", "renewTime": "2026-11-28T11:59:57Z"},
    }), NOW)
    assert lines == [
        "durablerun.durablerun.dev/review-agent Running: attempt 1 starting in pod review-agent-a1",
        "progress: 4 of 8 steps journaled; in flight: step 'research-b' (at 4, retry 1) for 30s",
        "cost: $0.42, 1200 tokens",
        "attempt 1 in pod review-agent-a1, lease renewed 3s ago",
    ]


def test_a_waiting_run_says_what_it_waits_for_and_that_no_pod_runs() -> None:
    lines = describe_status(_run({
        "phase": "Waiting", "message": "waiting for event review", "progress": {"completedSteps": 7},
        "waitingFor": {"event": "review", "since": "2026-11-28T11:00:00Z"},
    }), NOW)
    assert lines[1:] == ["progress: 7 steps journaled",
                         "waiting for event 'review' since 2026-11-28T11:00:00Z (no pod)"]


def test_a_run_not_started_yet_says_so() -> None:
    assert describe_status(_run({}), NOW) == ["durablerun.durablerun.dev/review-agent not started"]


def test_a_pod_that_has_not_acquired_its_lease_yet_says_so() -> None:
    lines = describe_status(_run({"phase": "Running", "attempt": 2, "pod": "r-a2",
                                  "lease": {"holder": "r-a1", "renewTime": "2026-11-28T11:50:00Z"}}), NOW)
    assert lines[-1] == "attempt 2 in pod r-a2, lease not held yet"
