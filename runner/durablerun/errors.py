"""Exceptions of the durable-run SDK.

The hierarchy says what happens next:

* :class:`StepError` is what a workflow sees when a step failed for good (its
  retries are exhausted, or it raised a :class:`NonRetryableError`). It is
  journaled, so a replay raises the same error again at the same point.
* :class:`EventTimeout` is raised by ``ctx.wait_for_event`` past its deadline.
* :class:`WorkflowError` and its subclasses (:class:`DivergenceError`,
  :class:`InputMismatchError`) mean the workflow code or its input do not fit
  the run's journal: the attempt ends as ``Failed`` and *nothing journaled is
  touched*, so fixed code can resume the run.
* :class:`StoreError` and its subclasses come from the journal store:
  :class:`CorruptionError` (checksum mismatch, a loud error, never a fresh
  start), :class:`FencedError` (another writer owns the run),
  :class:`StoreNotFoundError` / :class:`StoreAccessError` (configuration: exit
  2), :class:`StoreUnavailableError` (transient: treat like a crash).
* :class:`ConfigError` is a usage or configuration error (exit 2); its message
  names the flag or field and the fix.
"""

from __future__ import annotations

from typing import Any


class DurableRunError(Exception):
    """Base class of every error the SDK raises."""


# --- errors a workflow sees --------------------------------------------------


class NonRetryableError(DurableRunError):
    """Raise it (or a subclass) from a step to fail the step without retries."""


class StepError(DurableRunError):
    """A step failed for good. Raised in the workflow at the step's ``await``.

    ``type_name`` and ``message`` describe the step's last exception; they are
    journaled, so a replay raises an equal ``StepError`` (without the original
    exception object, which only the first execution has as ``__cause__``).
    """

    def __init__(
        self, step: str, position: str, type_name: str, message: str, attempts: int
    ) -> None:
        self.step = step
        self.position = position
        self.type_name = type_name
        self.message = message
        self.attempts = attempts
        tries = "attempt" if attempts == 1 else "attempts"
        super().__init__(
            f"step {step!r} (position {position}) failed after {attempts} {tries}: "
            f"{type_name}: {message}"
        )


class ResultNotSerializableError(NonRetryableError):
    """A step returned a value that cannot be journaled as JSON."""


class ResultTooLargeError(NonRetryableError):
    """A step's result is larger than the configured hard limit."""


class EventTimeout(DurableRunError):
    """``ctx.wait_for_event`` reached its deadline before the event arrived."""

    def __init__(self, event: str, deadline: str) -> None:
        self.event = event
        self.deadline = deadline
        super().__init__(f"event {event!r} did not arrive before its deadline {deadline}")


# --- errors that fail the attempt without touching the journal -----------------


class ChildRunFailed(DurableRunError):
    """A child run ended Failed or Aborted; awaiting it raises this (catch it to go on without it).

    ``child`` (the name given to start_child), ``run`` (its DurableRun), ``phase``, ``reason`` (an abort
    reason), ``message``.
    """

    def __init__(self, child: str, run: str, phase: str, message: str, reason: str | None = None) -> None:
        what = f"{phase} ({reason})" if reason else phase
        super().__init__(f"child run {run} {what}: {message}")
        self.child, self.run, self.phase, self.reason, self.message = child, run, phase, reason, message


class WorkflowError(DurableRunError):
    """The workflow code does not fit the run (outcome Failed, journal untouched)."""


class DivergenceError(WorkflowError):
    """Replay found a different operation at a journaled position."""


class InputMismatchError(WorkflowError):
    """The run was started with a different input (or workflow)."""


class WorkflowLoadError(WorkflowError):
    """The workflow module raised while being imported."""


# --- configuration -----------------------------------------------------------------


class ConfigError(DurableRunError):
    """A usage or configuration error (exit 2). The message says what to fix."""


class WorkflowNotFoundError(ConfigError):
    """The ``module:function`` reference names nothing importable."""


# --- stores ---------------------------------------------------------------------------


class StoreError(DurableRunError):
    """A journal store operation failed. The message carries the store and key."""

    def __init__(self, message: str, **context: Any) -> None:
        self.context = context
        if context:
            detail = ", ".join(f"{k}={v}" for k, v in context.items())
            message = f"{message} [{detail}]"
        super().__init__(message)


class CorruptionError(StoreError):
    """An object failed its checksum or does not parse. Never a fresh start."""


class FencedError(StoreError):
    """Another writer wrote a journal position first: this writer must stop."""


class StoreNotFoundError(StoreError, ConfigError):
    """The store itself (bucket, directory) does not exist."""


class StoreAccessError(StoreError, ConfigError):
    """The store refused our credentials."""


class StoreUnavailableError(StoreError):
    """The store could not be reached after retries. Transient: restart later."""


__all__ = [
    "ChildRunFailed",
    "ConfigError",
    "CorruptionError",
    "DivergenceError",
    "DurableRunError",
    "EventTimeout",
    "FencedError",
    "InputMismatchError",
    "NonRetryableError",
    "ResultNotSerializableError",
    "ResultTooLargeError",
    "StepError",
    "StoreAccessError",
    "StoreError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "WorkflowError",
    "WorkflowLoadError",
    "WorkflowNotFoundError",
]
