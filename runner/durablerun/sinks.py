"""Progress sinks: pluggable receivers of what an attempt is doing.

Every event is one :class:`ProgressEvent`: its ``kind`` (:class:`EventKind`)
and its ``fields``. A sink subclasses :class:`ProgressSink` and overrides
``emit(event)`` to get every event, or the methods named after the kinds it
cares about (the default ``emit`` calls them with the event's fields)::

    class StatusSink(ProgressSink):
        def step_completed(self, *, position, name, seq, ok, duration): ...
        def cost_updated(self, *, usd, tokens, steps): ...
        def run_finished(self, *, result): ...

Kinds and their fields: ``run_started(info)``, ``step_started(position, name, attempt)``,
``step_completed(position, name, seq, ok, duration)``,
``checkpoint_saved(seq, key)``, ``cost_updated(usd, tokens, steps)``,
``continued_as_new(generation, seq)``, ``total_steps_updated(total, steps)``,
``heartbeat(time)``, ``warning(message)``, ``run_finished(result)`` (every
outcome: completed, failed, aborted, waiting, suspended, fenced). They run on
the attempt's event-loop thread and must not block; an exception in a sink is
logged and ignored. :class:`JsonLinesSink` writes one JSON object per event.
"""

from durablerun._private.engine.sinks import EventKind, JsonLinesSink, ProgressEvent, ProgressSink

__all__ = ["EventKind", "JsonLinesSink", "ProgressEvent", "ProgressSink"]
