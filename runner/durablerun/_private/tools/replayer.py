"""The replayer: today's workflow code run against a recorded journal, executing nothing.

``durablerun replay`` and :func:`replay_run` (``durablerun.testing.replay_run``, for CI) run the
workflow function over a run's journal as its next attempt would (the current generation, from its
input), with the engine in replay-only mode (``EngineConfig.replay``): no step is executed, no sleep
slept, no event waited for, nothing written. It stops at the first divergence, or at the journal's
end, and reports which. Exit codes (docs/sdk.md, "Upgrading code under running runs"): 0 replays
cleanly, 1 diverges, 2 usage error (no such run, a journal layout newer than this code), 3 the
workflow raised something the journal does not explain, 75 the store could not be reached.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from durablerun import errors
from durablerun._private.engine.loading import load_workflow
from durablerun._private.engine.run import Run
from durablerun._private.records import layout
from durablerun._private.records.model import Divergence, EngineConfig, ReplayProbe
from durablerun._private.storage.stores import Store
from durablerun.api import Outcome

EXIT_CLEAN = 0
EXIT_DIVERGED = 1
EXIT_ERROR = 3
_STEP_ERROR = f"{errors.StepError.__module__}.{errors.StepError.__qualname__}"


@dataclass(frozen=True)
class ReplayReport:
    """How a workflow replayed a run's journal: cleanly, diverging, or raising (``error``)."""

    run: str
    #: Journal records up to where the replay stopped (every generation's count).
    records: int
    divergence: Divergence | None = None
    #: Where the journal ends: what the code would do next ("step 'x' at position 4"), or how it ended.
    end: str | None = None
    error: str | None = None

    @property
    def clean(self) -> bool:
        return self.divergence is None and self.error is None

    @property
    def exit_code(self) -> int:
        if self.divergence is not None:
            return EXIT_DIVERGED
        return EXIT_ERROR if self.error is not None else EXIT_CLEAN

    def summary(self) -> str:
        """One line for people and CI logs."""
        if self.divergence is not None:
            d = self.divergence
            return (f"run {self.run} diverges at journal position {d.position}: the journal holds {d.expected}, "
                    f"the code asks for {d.found} (journal layout v{layout.LAYOUT_VERSION} records no argument "
                    "fingerprints). Guard the change with ctx.patched (docs/sdk.md)")
        if self.error is not None:
            return f"run {self.run} does not replay: {self.error}"
        return f"run {self.run} replays cleanly: {self.records} journal records; {self.end}"

    def to_json(self) -> dict[str, Any]:
        d = self.divergence
        return {"run": self.run, "clean": self.clean, "records": self.records, "end": self.end,
                "error": self.error, "divergence": None if d is None else {
                    "position": d.position, "expected": d.expected, "found": d.found, "message": d.message}}


def check_layout(manifest: dict[str, Any], run: layout.RunRef) -> None:
    """Refuse, in one line, a journal written in a layout newer than this code reads."""
    version = manifest.get("layout", layout.LAYOUT_VERSION)
    if not isinstance(version, int) or version > layout.LAYOUT_VERSION:
        raise errors.ConfigError(
            f"run {run} was written in journal layout {version!r} (SDK {manifest.get('sdk', '?')}), newer than "
            f"this SDK reads (layout {layout.LAYOUT_VERSION}): replay it with that SDK or a later one")


def replay_run(store: Store, run: layout.RunRef, workflow: str | Callable[..., Any]) -> ReplayReport:
    """Replay ``workflow`` (``module:function`` or the function) against run ``run``'s journal in ``store``.

    Reads only. Raises ConfigError for a run that does not exist or a newer journal layout, and
    StoreError when the store cannot be read.
    """
    rs = store.run_store(run)
    try:
        manifest = rs.read_manifest()
    finally:
        rs.close()
    if manifest is None:
        raise errors.ConfigError(f"no run {run} in {store.uri}: nothing to replay (check the run id and the store)")
    check_layout(manifest, run)
    fn = load_workflow(workflow) if isinstance(workflow, str) else workflow
    probe = ReplayProbe()
    # active_before=0: maxDuration counts from now, so an old run's age never stops its replay.
    config = EngineConfig(replay=probe, active_before=timedelta(0), code_version="replay")
    result = Run(store=store, run=run, workflow=fn, input=manifest.get("input"), config=config).run_attempt()
    report = ReplayReport(run=str(run), records=result.journal_records, divergence=probe.divergence)
    if probe.divergence is not None:
        return report
    if probe.end is not None:
        return _with(report, end=f"the run would go on with {probe.end}")
    if result.outcome == Outcome.COMPLETED:
        return _with(report, end="the journal's workflow completed, and so does the code's")
    if result.outcome == Outcome.FAILED and result.error_type == _STEP_ERROR:
        return _with(report, end=f"the run failed there, as journaled: {result.message}")
    return _with(report, error=f"{result.outcome.value}: {result.message}")


def _with(report: ReplayReport, **fields: Any) -> ReplayReport:
    return ReplayReport(**{**report.__dict__, **fields})


def show(report: ReplayReport, *, as_json: bool) -> int:
    print(json.dumps(report.to_json(), indent=2) if as_json else report.summary())
    return report.exit_code
