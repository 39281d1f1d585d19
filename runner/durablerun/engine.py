"""Running a durable run, one attempt at a time: the API the CLI and the runner pod use.

An *attempt* loads the run's journal, runs the workflow (replaying what is
journaled, executing the rest), and ends with exactly one
:class:`AttemptResult` whose ``outcome`` (:class:`durablerun.api.Outcome`)
maps to the exit code of docs/design.md::

    from durablerun.engine import Run, EngineConfig
    from durablerun.stores import open_store, RunRef
    from durablerun.resource import Policy

    run = Run(
        store=open_store("s3://bucket/runs"),
        run=RunRef.kubernetes(namespace, name, uid),   # or RunRef.local("my-run")
        workflow="agents.research:run",                # or the async function itself
        input={"topic": "..."},
        policy=Policy(costCeilingUSD="5.00"),          # spec.policy, re-read every attempt
        sinks=[my_status_sink],                        # durablerun.sinks.ProgressSink
        config=EngineConfig(snapshot_every=100),
    )
    result = run.run_attempt()          # blocking; or: await run.run_attempt_async()
    sys.exit(result.exit_code)

``AttemptResult`` carries ``outcome``, ``message`` (what happened and what to
do), ``abort_reason`` (Aborted), ``result`` (Completed), ``waiting``
(:class:`WaitingFor`: ``event`` and ``deadline``, or ``wake_time``; plus
``since``), ``totals`` (usd, tokens, steps), ``journal_records``,
``error_type``; ``exit_code`` and ``termination_message()`` (compact JSON
for the container's termination message).

Control from other threads (a lease renewer, a signal handler):

* ``run.request_stop(grace=None)``: stop at the next step boundary; running
  steps get ``grace`` (default ``EngineConfig.stop_grace``) to finish and be
  journaled; outcome Suspended. Use it for SIGTERM and ``spec.suspend``.
* ``run.request_abort(reason, message)``: like a stop, but the outcome is
  Aborted(reason), e.g. ``AbortReason.USER_REQUESTED``.
* ``run.fence(message)``: the lease is lost. Stop *now*: the workflow is
  cancelled, nothing more is written, outcome Fenced.

A store that cannot be reached after retries makes ``run_attempt`` raise
:class:`~durablerun.errors.StoreUnavailableError`: treat it as a crash
(non-zero exit outside the outcome table) so the attempt is retried with
backoff. Every other problem is an outcome.

Each attempt writes the run's manifest at first (input hash, workflow, code
version), journals every operation before the next one starts, saves a
snapshot every ``snapshot_every`` records and at the end of the attempt, and
records the outcome in the run's ``status.json`` (not when Fenced).

:func:`input_hash` is the sha256 of the canonical JSON of an input: the value
the operator puts in ``status.inputHash``.
"""

from durablerun._private.engine.run import SDK_VERSION, Run, load_workflow
from durablerun._private.records.model import AttemptResult, EngineConfig, RunStarted, Totals, WaitingFor
from durablerun.api import input_hash

__all__ = [
    "SDK_VERSION",
    "AttemptResult",
    "EngineConfig",
    "Run",
    "RunStarted",
    "Totals",
    "WaitingFor",
    "input_hash",
    "load_workflow",
]
