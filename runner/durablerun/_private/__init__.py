"""Internals of the durable-run SDK. Nothing here is public API; import from
``durablerun``, ``durablerun.engine``, ``durablerun.stores`` and ``durablerun.sinks``."""
