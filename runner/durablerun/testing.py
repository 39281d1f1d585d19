"""Helpers for testing workflows: :class:`WorkflowTest` runs a workflow in a
private in-memory store, one attempt at a time, and delivers events on cue."""

from durablerun._private.testing import WorkflowTest

__all__ = ["WorkflowTest"]
