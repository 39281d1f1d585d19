"""Helpers for testing workflows: :class:`WorkflowTest` runs a workflow in a
private in-memory store, one attempt at a time, delivers events on cue and runs its child runs
in-process (or stands in :class:`ChildStub` outcomes for them); :func:`replay_run` checks
today's code against a recorded journal, executing nothing (a CI test of an upgrade)."""

from durablerun._private.engine.family import ChildStub, FamilyRun
from durablerun._private.engine.testing import WorkflowTest
from durablerun._private.tools.replayer import ReplayReport, replay_run

__all__ = ["ChildStub", "FamilyRun", "ReplayReport", "WorkflowTest", "replay_run"]
