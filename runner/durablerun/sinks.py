"""Progress sinks: pluggable receivers of what an attempt is doing.

Subclass :class:`ProgressSink` and override what you need::

    class StatusSink(ProgressSink):
        def step_completed(self, *, position, name, seq, ok, duration): ...
        def cost_updated(self, *, usd, tokens, steps): ...
        def run_finished(self, *, result): ...

Callbacks: ``run_started(info)``, ``step_started(position, name, attempt)``,
``step_completed(position, name, seq, ok, duration)``,
``checkpoint_saved(seq, key)``, ``cost_updated(usd, tokens, steps)``,
``continued_as_new(generation, seq)``, ``total_steps_updated(total, steps)``,
``heartbeat(time)``, ``warning(message)``, ``run_finished(result)`` (every
outcome: completed, failed, aborted, waiting, suspended, fenced). They run on
the attempt's event-loop thread and must not block; an exception in a sink is
logged and ignored. :class:`JsonLinesSink` writes one JSON object per event.
"""

from durablerun._private.sinks import JsonLinesSink, ProgressSink

__all__ = ["JsonLinesSink", "ProgressSink"]
