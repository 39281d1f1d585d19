"""The SDK in a process: a workflow's operations run, journaled and replayed (``core``, ``run``), the
context the workflow sees, child runs played locally, and the sinks and traces that watch it."""
